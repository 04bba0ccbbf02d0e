package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/relayq/relay/migrations"
)

func runMigrate(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("migrate", flag.ContinueOnError)
	url := fs.String("database-url", os.Getenv("DATABASE_URL"), "PostgreSQL URL")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *url == "" {
		return errors.New("migrate: no database: pass --database-url or set DATABASE_URL")
	}
	pool, err := openPool(ctx, *url, false)
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	defer pool.Close()
	res, err := migrations.Migrate(ctx, pool)
	if err != nil {
		return err
	}
	if len(res.Applied) == 0 {
		fmt.Println("migrate: schema is up to date")
		return nil
	}
	fmt.Println("migrate: applied", strings.Join(res.Applied, ", "))
	return nil
}
