package admin

import (
	"encoding/base64"
	"encoding/json"
	"math"
	"time"

	"github.com/danielgtaylor/huma/v2"
)

// Page sizes of every list.
const (
	defaultLimit = 50
	maxLimit     = 500
)

// cursor is a position in a list: the last row of the previous page. It
// travels as opaque base64url JSON; Kind says which ordering it belongs to,
// so a cursor from one list is refused by another.
type cursor struct {
	Kind string    `json:"k"`
	ID   int64     `json:"i"`
	At   time.Time `json:"t,omitzero"`
}

func (c cursor) encode() string {
	b, _ := json.Marshal(c)
	return base64.RawURLEncoding.EncodeToString(b)
}

// decodeCursor reads a cursor of the given kind; "" is the first page.
func decodeCursor(s, kind string) (*cursor, error) {
	if s == "" {
		return nil, nil
	}
	bad := huma.Error422UnprocessableEntity("invalid cursor", &huma.ErrorDetail{
		Location: "query.cursor", Message: "not a cursor of this list (pass next_cursor from the previous page unchanged)", Value: s,
	})
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil || len(b) > 200 {
		return nil, bad
	}
	var c cursor
	if err := json.Unmarshal(b, &c); err != nil || c.Kind != kind || c.ID <= 0 {
		return nil, bad
	}
	return &c, nil
}

// idBelow is the id bound of a page that starts after c (or at the top).
func idBelow(c *cursor) int64 {
	if c == nil {
		return math.MaxInt64
	}
	return c.ID
}
