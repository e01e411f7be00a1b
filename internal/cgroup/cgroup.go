// Package cgroup finds the unified (v2) cgroup hierarchy.
package cgroup

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
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

// Join moves this process (every thread) into the cgroup v2 directory
// dir. leave moves it back to where it was; it does not remove dir.
func Join(dir string) (leave func() error, err error) {
	root, err := V2Root()
	if err != nil {
		return nil, err
	}
	self, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return nil, err
	}
	home := root
	for _, l := range strings.Split(string(self), "\n") {
		if rest, ok := strings.CutPrefix(l, "0::"); ok {
			home = filepath.Join(root, rest)
		}
	}
	pid := []byte(strconv.Itoa(os.Getpid()))
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), pid, 0o644); err != nil {
		return nil, fmt.Errorf("joining %s: %w", dir, err)
	}
	return func() error {
		if err := os.WriteFile(filepath.Join(home, "cgroup.procs"), pid, 0o644); err != nil {
			return fmt.Errorf("leaving %s: %w", dir, err)
		}
		return nil
	}, nil
}
