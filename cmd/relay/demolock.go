package main

import (
	"errors"
	"fmt"
	"os"
	"syscall"
)

// lockDemoDir takes the lock of the demo's own cluster directory, so that a
// second `relay demo` (or one beside a running `relay demo --dashboard`)
// fails at once, naming what is in the way, instead of replacing the first
// one's cluster under it or meeting its initdb. The operating system
// releases the lock when the process ends, however it ends.
func lockDemoDir() (release func(), err error) {
	path := demoDir() + ".lock"
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("demo: lock %s: %w", path, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("demo: another relay demo is using %s (its own PostgreSQL): wait for it to end, or pass --database-url", demoDir())
		}
		return nil, fmt.Errorf("demo: lock %s: %w", path, err)
	}
	return func() { f.Close() }, nil
}
