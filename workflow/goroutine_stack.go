//go:build !amd64 && !arm64

package workflow

// goroutineID names the calling goroutine: see goroutineIDFromStack.
func goroutineID() uint64 { return goroutineIDFromStack() }
