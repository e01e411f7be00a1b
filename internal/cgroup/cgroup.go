// Package cgroup finds the unified (v2) cgroup hierarchy.
package cgroup

import (
	"bufio"
	"errors"
	"os"
	"strings"
)

// V2Root is the mount point of the unified (v2) cgroup hierarchy: the root
// every process of the machine is under.
func V2Root() (string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// id parent major:minor root mountpoint options ... - fstype source super
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		fields, pf := strings.Fields(pre), strings.Fields(post)
		if len(fields) >= 5 && len(pf) >= 1 && pf[0] == "cgroup2" {
			return fields[4], nil
		}
	}
	if err := sc.Err(); err != nil {
		return "", err
	}
	return "", errors.New("no cgroup2 filesystem is mounted (mount -t cgroup2 none /sys/fs/cgroup)")
}
