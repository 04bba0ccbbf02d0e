package migrations

// MigrateFS is migrateFS, for tests of the runner on files of their own.
var MigrateFS = migrateFS
