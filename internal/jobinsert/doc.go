// Package jobinsert is the engine's job insert, which core's Enqueue and
// the workflow layer's start of a run are both built on: the row a job is
// sent as (Row, AppendBatch), the statements that insert rows, alone or
// inside another layer's statement (SQL, SQLInto), the producer span and
// the count of inserted jobs (StartSpan, Count), and the wake-up of a
// queue's workers after an insert committed (Wake).
//
// It imports none of Relay's public packages, and holds no state but the
// wake-up coalescer's (one per process, so that every insert on a pool
// coalesces with every other, whichever layer made it).
package jobinsert
