package ipam

import (
	"bufio"
	"os"
	"strings"

	"github.com/containernetworking/cni/pkg/types"
)

// parseResolvConf reads nameserver, domain, search and options lines of a
// resolv.conf-format file into a CNI DNS section, as host-local does.
func parseResolvConf(path string) (*types.DNS, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()

	dns := &types.DNS{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' || line[0] == ';' {
			continue
		}
		fields := strings.Fields(line)
		if len(fields) < 2 {
			continue
		}
		switch fields[0] {
		case "nameserver":
			dns.Nameservers = append(dns.Nameservers, fields[1])
		case "domain":
			dns.Domain = fields[1]
		case "search":
			dns.Search = append(dns.Search, fields[1:]...)
		case "options":
			dns.Options = append(dns.Options, fields[1:]...)
		}
	}
	return dns, sc.Err()
}
