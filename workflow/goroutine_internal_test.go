package workflow

import (
	"fmt"
	"sync"
	"testing"
)

func TestGoroutineID(t *testing.T) {
	t.Parallel()
	own := goroutineID()
	if own == 0 || goroutineID() != own {
		t.Fatalf("goroutine id %d is not stable", own)
	}
	var deep uint64
	atDepth(5000, func() { deep = goroutineID() }) // the stack grows, and moves
	if deep != own || goroutineID() != own {
		t.Fatalf("goroutine id %d became %d on a grown stack, %d after", own, deep, goroutineID())
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

// The stack trace's cost grows with the stack's depth; a workflow
// primitive is called some 30 frames down, under the core's handler and
// the workflow function.
func BenchmarkGoroutineID(b *testing.B) {
	for _, id := range []struct {
		name string
		fn   func() uint64
	}{{"getg", goroutineID}, {"stack", goroutineIDFromStack}} {
		for _, depth := range []int{1, 30} {
			b.Run(fmt.Sprintf("%s/depth=%d", id.name, depth), func(b *testing.B) {
				atDepth(depth, func() {
					for b.Loop() {
						id.fn()
					}
				})
			})
		}
	}
}

//go:noinline
func atDepth(n int, fn func()) {
	if n <= 1 {
		fn()
		return
	}
	atDepth(n-1, fn)
}

// Both ways of naming a goroutine tell the same goroutines apart.
func TestGoroutineIDFromStack(t *testing.T) {
	t.Parallel()
	own := goroutineIDFromStack()
	var other uint64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); other = goroutineIDFromStack() }()
	wg.Wait()
	if own == 0 || other == 0 || other == own || goroutineIDFromStack() != own {
		t.Fatalf("ids from the stack: this goroutine %d (then %d), another %d", own, goroutineIDFromStack(), other)
	}
}
