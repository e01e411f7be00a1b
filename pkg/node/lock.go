package node

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// Lock is a flock on a file under stateDir. Every verb holds the node lock
// shared; loading or upgrading programs and GC hold it exclusively, so they
// never see an endpoint half made.
type Lock struct{ f *os.File }

// NodeLock takes the node lock of stateDir, shared or exclusive.
func NodeLock(stateDir string, exclusive bool) (*Lock, error) {
	if err := os.MkdirAll(stateDir, 0o700); err != nil {
		return nil, fmt.Errorf("creating state dir %s: %w", stateDir, err)
	}
	return FileLock(filepath.Join(stateDir, "node.lock"), exclusive)
}

// FileLock takes a flock on path (created if missing, with its
// directory), shared or exclusive.
func FileLock(path string, exclusive bool) (*Lock, error) {
	f, err := openLockFile(path)
	if err != nil {
		return nil, fmt.Errorf("opening lock %s: %w", path, err)
	}
	how := unix.LOCK_SH
	if exclusive {
		how = unix.LOCK_EX
	}
	if err := flock(f, how); err != nil {
		f.Close()
		return nil, fmt.Errorf("locking %s: %w", path, err)
	}
	return &Lock{f: f}, nil
}

// TryFileLock takes path exclusively if nobody holds it: nil, nil when
// somebody does.
func TryFileLock(path string) (*Lock, error) {
	f, err := openLockFile(path)
	if err != nil {
		return nil, fmt.Errorf("opening lock %s: %w", path, err)
	}
	if err := flock(f, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if err == unix.EWOULDBLOCK {
			return nil, nil
		}
		return nil, fmt.Errorf("locking %s: %w", path, err)
	}
	return &Lock{f: f}, nil
}

func openLockFile(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if errors.Is(err, os.ErrNotExist) {
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			return nil, err
		}
		f, err = os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	}
	return f, err
}

func flock(f *os.File, how int) error {
	for {
		err := unix.Flock(int(f.Fd()), how)
		if err != unix.EINTR {
			return err
		}
	}
}

// Unlock releases the lock; nil-safe.
func (l *Lock) Unlock() {
	if l != nil && l.f != nil {
		_ = l.f.Close() // closing drops the flock
		l.f = nil
	}
}

// Upgrade turns a shared lock exclusive, waiting for the other holders. Not
// atomic (flock drops the shared lock first): callers re-check what they
// decided under the shared lock.
func (l *Lock) Upgrade() error { return flock(l.f, unix.LOCK_EX) }

// Downgrade turns an exclusive lock shared again.
func (l *Lock) Downgrade() error { return flock(l.f, unix.LOCK_SH) }
