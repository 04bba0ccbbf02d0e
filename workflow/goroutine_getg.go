//go:build amd64 || arm64

package workflow

// getg returns the address of the calling goroutine's runtime descriptor
// (the runtime's g), read from its register or thread-local slot. No two
// goroutines alive at once share it; one that has exited may have its
// descriptor reused by a later goroutine.
func getg() uintptr

// goroutineID names the calling goroutine among those alive: its runtime
// descriptor's address. The execution's goroutine is alive for the whole
// execution, so no other goroutine calling a primitive meanwhile can bear
// its name. Formatting the stack header instead (goroutineIDFromStack)
// walks and prints every frame of the stack, which under a core handler
// and a workflow function cost more than a primitive's share of a
// checkpoint group (BenchmarkGoroutineID's deep case).
func goroutineID() uint64 { return uint64(getg()) }
