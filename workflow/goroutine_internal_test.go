package workflow

import (
	"sync"
	"testing"
)

func TestGoroutineID(t *testing.T) {
	t.Parallel()
	own := goroutineID()
	if own == 0 || goroutineID() != own {
		t.Fatalf("goroutine id %d is not stable", own)
	}
	var other uint64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); other = goroutineID() }()
	wg.Wait()
	if other == 0 || other == own {
		t.Fatalf("another goroutine's id %d, this one's %d", other, own)
	}
}

func BenchmarkGoroutineID(b *testing.B) {
	for b.Loop() {
		goroutineID()
	}
}
