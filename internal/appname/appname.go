// Package appname names the connections Relay opens for its own roles in
// pg_stat_activity.
package appname

// For is the application_name a connection Relay opens for one of its own
// roles (worker, heartbeat, listener, completer, scheduler, dispatcher, serve) gives
// itself: "relay-<role>", after the user's own application_name when set
// (so "billing relay-worker"), then id when given, cut to the 63 bytes
// PostgreSQL keeps.
func For(user, role, id string) string {
	name := "relay-" + role
	if user != "" {
		name = user + " " + name
	}
	if id != "" {
		name += " " + id
	}
	if len(name) > 63 {
		name = name[:63]
	}
	return name
}
