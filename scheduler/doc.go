// Package scheduler will hold cron-scheduled recurring jobs (robfig/cron/v3
// syntax, plus L and LW for month-end), enqueuing exactly one job per
// schedule and fire time across any number of processes.
//
// Not built yet.
package scheduler
