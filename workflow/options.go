package workflow

import "errors"

// ErrBadOptions: an option given to a call is out of range (a negative
// timeout or attempt count, a policy value that does not exist). The
// error names the option and its value; nothing was written.
var ErrBadOptions = errors.New("workflow: bad options")
