package migrations

// MigrateFS is migrateFS, for tests of the runner on files of their own.
var MigrateFS = migrateFS

// Files is the embedded migration files; SplitParts cuts a file run outside
// a transaction into its parts.
var (
	Files      = files
	SplitParts = splitParts
)
