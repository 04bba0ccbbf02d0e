// Package scheduler fires cron-scheduled recurring jobs: at each fire time of
// a schedule, exactly one job is enqueued, however many processes run a
// Scheduler.
//
// Schedules are declared in code and stored in relay_schedules when a
// Scheduler starts:
//
//	s, err := scheduler.New(pool, &scheduler.Config{Schedules: []scheduler.Schedule{{
//		Name:     "month-end-settlement",
//		Spec:     "0 2 L * *", // 02:00 on the last day of the month
//		TimeZone: "America/New_York",
//		Args:     SettleArgs{Ledger: "main"},
//	}}})
//	err = s.Start(ctx)
//
// Exactly once: a scheduler locks the due schedule rows (FOR UPDATE SKIP
// LOCKED, on the database's clock), records each fire in
// relay_schedule_fires, whose primary key is (schedule, fire time), enqueues
// its job and advances the schedule — all in one transaction. A process
// killed mid-fire rolls back; another takes the fire over.
//
// Schedules belong to a namespace (Config.Namespace, one per service) and a
// schedule is retired only when no live process of its namespace declares
// it, so a rolling deploy, or two services on one database, never disables
// a schedule still in use.
//
// Specs are robfig/cron/v3 syntax plus L and LW for month-end (see Spec);
// daylight-saving rules, catch-up after downtime and overlap policies are in
// docs/scheduler.md. List, Pause, Resume and TriggerNow manage stored
// schedules.
package scheduler
