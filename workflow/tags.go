package workflow

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
)

// MaxTags is the most tags a run may carry (StartOpts.Tags and AddTags
// together); MaxTagBytes the longest tag.
const (
	MaxTags     = 32
	MaxTagBytes = 255
)

// ErrInvalidTag: a run tag is empty, longer than MaxTagBytes, not UTF-8 or
// holds a NUL byte, or a run would carry more than MaxTags.
var ErrInvalidTag = errors.New("workflow: invalid run tag")

// checkTags validates tags and returns them without duplicates, in the
// order given (nil for none).
func checkTags(tags []string) ([]string, error) {
	if len(tags) == 0 {
		return nil, nil
	}
	out := make([]string, 0, len(tags))
	for _, t := range tags {
		switch {
		case t == "":
			return nil, fmt.Errorf("%w: a tag is empty", ErrInvalidTag)
		case len(t) > MaxTagBytes:
			return nil, fmt.Errorf("%w: tag %.40q… is %d bytes, over %d", ErrInvalidTag, t, len(t), MaxTagBytes)
		case !utf8.ValidString(t):
			return nil, fmt.Errorf("%w: tag %q is not valid UTF-8", ErrInvalidTag, t)
		case strings.IndexByte(t, 0) >= 0:
			return nil, fmt.Errorf("%w: tag %q holds a NUL byte", ErrInvalidTag, t)
		}
		if !slices.Contains(out, t) {
			out = append(out, t)
		}
	}
	if len(out) > MaxTags {
		return nil, fmt.Errorf("%w: %d tags, at most %d", ErrInvalidTag, len(out), MaxTags)
	}
	return out, nil
}

// AddTags adds tags to the run (those it carries already are kept once):
// the workflow labels itself as it learns ("customer:c-9" once a step
// looked the customer up), for ListOpts.Tags and the admin API's ?tag=
// filter. It is a checkpoint ("tags:<n>"), written once and skipped on
// replay. An invalid tag, or more than MaxTags on the run, is an error
// matching ErrInvalidTag, on this execution and every replay, and adds
// nothing.
func AddTags(wctx Context, tags ...string) error {
	x := wctx.x
	if err := x.enter("AddTags"); err != nil {
		return err
	}
	x.tagSeq++
	key := "tags:" + strconv.Itoa(x.tagSeq)
	pos, h := x.next("tags", key)
	if h != nil {
		return nil
	}
	x.checkCancel()
	add, err := checkTags(tags)
	if err != nil {
		return fmt.Errorf("workflow: run %s: add tags: %w", x.runID, err)
	}
	var refused error
	err = x.write(func(ctx context.Context, tx pgx.Tx) error {
		var have []string
		if err := tx.QueryRow(ctx, sqlRunTags, x.runID).Scan(&have); err != nil {
			return fmt.Errorf("read tags: %w", err)
		}
		merged := have
		for _, t := range add {
			if !slices.Contains(merged, t) {
				merged = append(merged, t)
			}
		}
		if len(merged) > MaxTags {
			refused = fmt.Errorf("workflow: run %s: add tags: %w: the run would carry %d tags, at most %d", x.runID, ErrInvalidTag, len(merged), MaxTags)
			return refused
		}
		if len(merged) > len(have) {
			if _, err := tx.Exec(ctx, sqlSetRunTags, x.runID, merged); err != nil {
				return fmt.Errorf("set tags: %w", err)
			}
		}
		_, err := x.upsert(ctx, tx, &stepRow{position: pos, key: key, kind: "tags", state: stepCompleted}, 1, nil, 0)
		return err
	})
	if refused != nil && errors.Is(err, refused) {
		return refused // rolled back: nothing recorded, and a replay meets the same count
	}
	if err != nil {
		x.writeFailed(err)
	}
	return nil
}
