// Package netfault is a TCP proxy that can cut its traffic off and restore
// it, for tests and the prover: a network partition between a client and
// PostgreSQL, on one machine.
//
// Cut does not close connections or drop bytes: it stops forwarding, as a
// partitioned network would, and the bytes in flight are delivered once
// Restore is called (as TCP retransmission would). New connections made
// while cut wait for the restore before they reach the target.
package netfault

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
)

// Proxy forwards TCP connections from its listener to a target address.
type Proxy struct {
	target string
	ln     net.Listener

	mu    sync.Mutex
	open  chan struct{} // closed while traffic flows
	conns map[net.Conn]struct{}
	done  bool
	wg    sync.WaitGroup
}

// Listen starts a proxy on 127.0.0.1 (a free port) to target (host:port).
func Listen(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("netfault: listen: %w", err)
	}
	p := &Proxy{target: target, ln: ln, open: make(chan struct{}), conns: map[net.Conn]struct{}{}}
	close(p.open)
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the proxy's address (host:port).
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Cut stops all traffic through the proxy until Restore.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.open:
		p.open = make(chan struct{})
	default: // already cut
	}
}

// Restore lets traffic flow again.
func (p *Proxy) Restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.open:
	default:
		close(p.open)
	}
}

// Close stops the proxy and closes every connection through it.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.done = true
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.Restore()
	err := p.ln.Close()
	p.wg.Wait()
	return err
}

// gate waits until traffic may flow, or the proxy closes.
func (p *Proxy) gate() bool {
	p.mu.Lock()
	open, done := p.open, p.done
	p.mu.Unlock()
	if done {
		return false
	}
	<-open
	p.mu.Lock()
	defer p.mu.Unlock()
	return !p.done
}

func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done {
		c.Close()
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if !p.track(c) {
			return
		}
		p.wg.Add(1)
		go p.serve(c)
	}
}

func (p *Proxy) serve(c net.Conn) {
	defer p.wg.Done()
	defer c.Close()
	if !p.gate() {
		return
	}
	var d net.Dialer
	u, err := d.DialContext(context.Background(), "tcp", p.target)
	if err != nil {
		return
	}
	if !p.track(u) {
		return
	}
	defer u.Close()
	done := make(chan struct{}, 2)
	go func() { p.pipe(u, c); done <- struct{}{} }()
	go func() { p.pipe(c, u); done <- struct{}{} }()
	<-done
	c.Close()
	u.Close()
	<-done
}

// pipe copies src to dst, holding each chunk while the proxy is cut.
func (p *Proxy) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !p.gate() {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				return
			}
			if tc, ok := dst.(*net.TCPConn); ok {
				tc.CloseWrite()
			}
			return
		}
	}
}
