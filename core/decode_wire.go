package core

import (
	"encoding/binary"
	"math"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// The claim's columns as claimDecoder reads them, in the order of
// claimedRow.dest: each column's expression in the claim statements'
// RETURNING list (claimReturning is built from them), its type, and
// whether its value must come in the binary format (text and jsonb may
// come in either).
var claimedColumns = [...]struct {
	expr   string
	oid    uint32
	binary bool
}{
	{"j.id", pgtype.Int8OID, true},
	{"j.kind", pgtype.TextOID, false},
	{"j.queue", pgtype.TextOID, false},
	{"j.priority", pgtype.Int2OID, true},
	{"j.attempt", pgtype.Int4OID, true},
	{"j.max_attempts", pgtype.Int4OID, true},
	{"j.run_at", pgtype.TimestamptzOID, true},
	{"j.created_at", pgtype.TimestamptzOID, true},
	{"j.attempted_at", pgtype.TimestamptzOID, true},
	{"j.args", pgtype.JSONBOID, false},
	{"j.metadata", pgtype.JSONBOID, false},
	{"j.lease_token", pgtype.UUIDOID, true},
	{"coalesce(j.ordering_key, '')", pgtype.TextOID, false},
	{"j.tags", pgtype.TextArrayOID, true},
}

// claimedWireFormat says whether a claim's result came in the types and
// formats claimDecoder reads.
func claimedWireFormat(fds []pgconn.FieldDescription) bool {
	if len(fds) != len(claimedColumns) {
		return false
	}
	for i, fd := range fds {
		col := claimedColumns[i]
		if fd.DataTypeOID != col.oid || (col.binary && fd.Format != pgtype.BinaryFormatCode) ||
			(fd.Format != pgtype.BinaryFormatCode && fd.Format != pgtype.TextFormatCode) {
			return false
		}
	}
	return true
}

// claimDecoder reads claimed rows from their wire format, the values pgx's
// Scan would give (TestClaimDecoderMatchesScan), at a fraction of its cost:
// a claim of 1,000 rows went through 14,000 scan plans, a string per kind
// and queue and a slice per tag list. It keeps the last kind and queue read
// and reuses their strings. Formats are checked once per result set
// (claimedWireFormat); fds gives each text or jsonb column's.
type claimDecoder struct {
	fds         []pgconn.FieldDescription
	kind, queue string
}

// decode reads one row into r. It returns false for a value it does not
// read (a NULL where the claim never returns one, a timestamp out of
// Go's range, a tag list of several dimensions): Scan reads that row, and
// reports what is wrong with it as before.
func (d *claimDecoder) decode(vals [][]byte, r *claimedRow) bool {
	if len(vals) != len(claimedColumns) {
		return false
	}
	for i, v := range vals {
		if v == nil && i != 9 && i != 10 && i != 13 { // args, metadata and tags may be NULL
			return false
		}
	}
	var ok bool
	if r.id, ok = int8Wire(vals[0]); !ok {
		return false
	}
	r.kind = intern(&d.kind, vals[1])
	r.queue = intern(&d.queue, vals[2])
	p, ok := int2Wire(vals[3])
	if !ok {
		return false
	}
	r.priority = p
	if r.attempt, ok = int4Wire(vals[4]); !ok {
		return false
	}
	if r.maxAttempts, ok = int4Wire(vals[5]); !ok {
		return false
	}
	for i, dst := range []*pgtype.Timestamptz{&r.runAt, &r.createdAt, &r.attemptedAt} {
		if *dst, ok = timestamptzWire(vals[6+i]); !ok {
			return false
		}
	}
	args, ok := d.jsonb(9, vals[9])
	if !ok {
		return false
	}
	meta, ok := d.jsonb(10, vals[10])
	if !ok {
		return false
	}
	// One allocation for both documents (they are copied: the values are
	// the connection's buffer).
	if args != nil || meta != nil {
		buf := make([]byte, len(args)+len(meta))
		n := copy(buf, args)
		copy(buf[n:], meta)
		if args != nil {
			r.args = buf[:n:n]
		}
		if meta != nil {
			r.meta = buf[n:]
		}
	}
	if len(vals[11]) != 16 {
		return false
	}
	copy(r.token[:], vals[11])
	if len(vals[12]) > 0 {
		r.orderingKey = string(vals[12])
	}
	if r.tags, ok = textArrayWire(vals[13]); !ok {
		return false
	}
	return true
}

// jsonb is column i's document: the JSON text, without the binary
// format's version byte.
func (d *claimDecoder) jsonb(i int, v []byte) ([]byte, bool) {
	if v == nil {
		return nil, true
	}
	if d.fds == nil || d.fds[i].Format != pgtype.BinaryFormatCode {
		return v, true
	}
	if len(v) == 0 || v[0] != 1 {
		return nil, false
	}
	return v[1:], true
}

// intern returns v as a string, last's when it holds the same bytes (one
// allocation per kind or queue of a claim, not per row).
func intern(last *string, v []byte) string {
	if *last != string(v) { // compared without a conversion
		*last = string(v)
	}
	return *last
}

func int8Wire(v []byte) (int64, bool) {
	if len(v) != 8 {
		return 0, false
	}
	return int64(binary.BigEndian.Uint64(v)), true
}

func int4Wire(v []byte) (int32, bool) {
	if len(v) != 4 {
		return 0, false
	}
	return int32(binary.BigEndian.Uint32(v)), true
}

func int2Wire(v []byte) (int16, bool) {
	if len(v) != 2 {
		return 0, false
	}
	return int16(binary.BigEndian.Uint16(v)), true
}

// The range of timestamptz pgx reads into a time.Time, in microseconds
// since 2000-01-01: from -4713-11-24 to 294277-01-01, exclusive (pgx's
// own bounds); beyond it Scan reports the error.
const (
	wireMinMicros = -211_813_488_000_000_000
	wireEndMicros = 9_223_371_331_200_000_000
)

// timestamptzWire reads a binary timestamptz (microseconds since
// 2000-01-01 UTC) as pgtype.Timestamptz does, in the local time zone.
func timestamptzWire(v []byte) (pgtype.Timestamptz, bool) {
	raw, ok := int8Wire(v)
	if !ok {
		return pgtype.Timestamptz{}, false
	}
	switch raw {
	case math.MaxInt64:
		return pgtype.Timestamptz{Valid: true, InfinityModifier: pgtype.Infinity}, true
	case math.MinInt64:
		return pgtype.Timestamptz{Valid: true, InfinityModifier: pgtype.NegativeInfinity}, true
	}
	if raw < wireMinMicros || raw >= wireEndMicros {
		return pgtype.Timestamptz{}, false
	}
	const y2k = 946_684_800 * 1_000_000 // microseconds from the Unix epoch to 2000-01-01
	t := time.Unix(y2k/1_000_000+raw/1_000_000, (y2k%1_000_000*1_000)+(raw%1_000_000*1_000))
	return pgtype.Timestamptz{Time: t, Valid: true}, true
}

// textArrayWire reads a binary text[] of at most one dimension (nil for
// NULL, empty for an empty array).
func textArrayWire(v []byte) ([]pgtype.Text, bool) {
	if v == nil {
		return nil, true
	}
	if len(v) < 12 {
		return nil, false
	}
	ndim := int32(binary.BigEndian.Uint32(v))
	if binary.BigEndian.Uint32(v[8:]) != pgtype.TextOID {
		return nil, false
	}
	if ndim == 0 {
		return []pgtype.Text{}, true
	}
	if ndim != 1 || len(v) < 20 {
		return nil, false
	}
	n := int32(binary.BigEndian.Uint32(v[12:]))
	if n < 0 || int(n) > len(v) {
		return nil, false
	}
	out := make([]pgtype.Text, n)
	v = v[20:]
	for i := range out {
		if len(v) < 4 {
			return nil, false
		}
		l := int32(binary.BigEndian.Uint32(v))
		v = v[4:]
		if l == -1 {
			continue // NULL
		}
		if l < 0 || int(l) > len(v) {
			return nil, false
		}
		out[i] = pgtype.Text{String: string(v[:l]), Valid: true}
		v = v[l:]
	}
	return out, len(v) == 0
}
