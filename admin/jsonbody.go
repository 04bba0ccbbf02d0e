package admin

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/danielgtaylor/huma/v2"
)

// strictJSON is the API's JSON format: huma's default, except that a body
// whose object names one key twice is refused. encoding/json keeps the last
// value of a repeated key, and other parsers the first, so
// {"dry_run": true, "dry_run": false} would be a dry run to a proxy or a
// log reader and a real run here. Both decodes of a request body (into
// `any` for validation, then into the input type) go through Unmarshal,
// so the refusal is a 400 problem naming the key.
var strictJSON = huma.Format{
	Marshal: huma.DefaultJSONFormat.Marshal,
	Unmarshal: func(data []byte, v any) error {
		if err := checkNoDuplicateKeys(data); err != nil {
			return err
		}
		return json.Unmarshal(data, v)
	},
}

// checkNoDuplicateKeys walks a JSON text and fails on the first object that
// holds a key twice, naming it by its path ("filter.state"). It leaves
// syntax errors to the decoder that follows (it returns nil on them).
func checkNoDuplicateKeys(data []byte) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	err := walkJSONValue(dec, "")
	var dup *duplicateKeyError
	if errors.As(err, &dup) {
		return dup
	}
	return nil
}

// duplicateKeyError names a key an object holds twice.
type duplicateKeyError struct{ key, path string }

func (e *duplicateKeyError) Error() string {
	return fmt.Sprintf("duplicate key %q in a JSON object (at %s): each key may appear once", e.key, e.path)
}

// walkJSONValue reads one value from dec, checking the keys of every
// object in it; path names the value.
func walkJSONValue(dec *json.Decoder, path string) error {
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	switch tok {
	case json.Delim('{'):
		seen := map[string]bool{}
		for dec.More() {
			tok, err := dec.Token()
			if err != nil {
				return err
			}
			key, _ := tok.(string)
			at := key
			if path != "" {
				at = path + "." + key
			}
			if seen[key] {
				return &duplicateKeyError{key: key, path: at}
			}
			seen[key] = true
			if err := walkJSONValue(dec, at); err != nil {
				return err
			}
		}
		_, err = dec.Token() // }
		return err
	case json.Delim('['):
		for i := 0; dec.More(); i++ {
			if err := walkJSONValue(dec, path+"["+strconv.Itoa(i)+"]"); err != nil {
				return err
			}
		}
		_, err = dec.Token() // ]
		return err
	}
	return nil
}
