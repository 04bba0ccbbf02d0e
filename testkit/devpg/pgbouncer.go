package devpg

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// ErrNoPgBouncer says no pgbouncer binary was found.
var ErrNoPgBouncer = errors.New("devpg: no pgbouncer binary found: install PgBouncer (e.g. apt-get install pgbouncer) or set RELAY_PGBOUNCER to its path")

// BouncerOptions tune StartBouncer. The zero value is transaction pooling
// with 20 server connections per database and user.
type BouncerOptions struct {
	// PoolMode is PgBouncer's pool_mode: "transaction" (the default),
	// "session" or "statement".
	PoolMode string
	// PoolSize is default_pool_size: server connections per database and
	// user pair. Default 20.
	PoolSize int
	// Users are the roles allowed to connect, besides the upstream URL's
	// (PgBouncer's auth_file; authentication is trust, loopback only).
	Users []string
	// Extra lines appended to the [pgbouncer] section, as "key = value".
	Extra []string
	// ConnectQuery, when set, runs on every server connection PgBouncer
	// opens (its connect_query): a way to give the pooled sessions a
	// search_path, which PgBouncer refuses as a startup parameter.
	ConnectQuery string
}

// Bouncer is a running PgBouncer in front of a server. Stop ends it and
// removes its directory.
type Bouncer struct {
	Dir  string // holds pgbouncer.ini, the auth file and pgbouncer.log
	Port int
	// URL is the upstream URL with its host and port replaced by the
	// bouncer's: the same user and database, through the pooler. Of the
	// upstream's query only sslmode is kept: PgBouncer refuses most
	// startup parameters (search_path among them).
	URL string

	cmd  *exec.Cmd
	done chan struct{}
}

// BouncerBin finds the pgbouncer binary: $RELAY_PGBOUNCER, then PATH, then
// Debian's /usr/sbin/pgbouncer.
func BouncerBin() (string, error) {
	if p := os.Getenv("RELAY_PGBOUNCER"); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("devpg: RELAY_PGBOUNCER=%s: %w", p, err)
		}
		return p, nil
	}
	if p, err := exec.LookPath("pgbouncer"); err == nil {
		return p, nil
	}
	if _, err := os.Stat("/usr/sbin/pgbouncer"); err == nil {
		return "/usr/sbin/pgbouncer", nil
	}
	return "", ErrNoPgBouncer
}

// StartBouncer starts PgBouncer on a free loopback port in front of the
// server upstream (a postgres:// URL on a TCP host) and waits until a
// connection through it works. As root it runs PgBouncer as the user
// devpg's clusters run as.
func StartBouncer(ctx context.Context, upstream string, opts BouncerOptions) (*Bouncer, error) {
	bin, err := BouncerBin()
	if err != nil {
		return nil, err
	}
	u, err := url.Parse(upstream)
	if err != nil {
		return nil, fmt.Errorf("devpg: bouncer: parse the upstream URL: %w", err)
	}
	host, upPort := u.Hostname(), cmp.Or(u.Port(), "5432")
	if host == "" || strings.HasPrefix(host, "/") {
		return nil, fmt.Errorf("devpg: bouncer: the upstream URL needs a TCP host, got %q", host)
	}
	reapBouncers()
	dir, err := os.MkdirTemp("", "relay-pgbouncer-")
	if err != nil {
		return nil, fmt.Errorf("devpg: bouncer: temp dir: %w", err)
	}
	fail := func(err error) (*Bouncer, error) {
		os.RemoveAll(dir)
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, ownerFile), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		return fail(fmt.Errorf("devpg: bouncer: %w", err))
	}
	port, err := freePort()
	if err != nil {
		return fail(err)
	}
	users := append([]string{cmp.Or(u.User.Username(), "postgres")}, opts.Users...)
	var auth strings.Builder
	for _, name := range users {
		fmt.Fprintf(&auth, "%q \"\"\n", name)
	}
	ini := []string{
		"[databases]",
		fmt.Sprintf("* = host=%s port=%s", host, upPort) + connectQuery(opts.ConnectQuery),
		"[pgbouncer]",
		"listen_addr = 127.0.0.1",
		"listen_port = " + strconv.Itoa(port),
		"unix_socket_dir =",
		"auth_type = trust",
		"auth_file = " + filepath.Join(dir, "users.txt"),
		"pool_mode = " + cmp.Or(opts.PoolMode, "transaction"),
		"default_pool_size = " + strconv.Itoa(cmp.Or(opts.PoolSize, 20)),
		"max_client_conn = 1000",
		"logfile = " + filepath.Join(dir, "pgbouncer.log"),
		"pidfile = " + filepath.Join(dir, "pgbouncer.pid"),
		"admin_users = " + users[0],
	}
	ini = append(ini, opts.Extra...)
	if err := os.WriteFile(filepath.Join(dir, "users.txt"), []byte(auth.String()), 0o644); err != nil {
		return fail(fmt.Errorf("devpg: bouncer: %w", err))
	}
	if err := os.WriteFile(filepath.Join(dir, "pgbouncer.ini"), []byte(strings.Join(ini, "\n")+"\n"), 0o644); err != nil {
		return fail(fmt.Errorf("devpg: bouncer: %w", err))
	}
	var cred *syscall.Credential
	if os.Geteuid() == 0 {
		// PgBouncer refuses to run as root.
		if cred, err = unprivileged(); err != nil {
			return fail(err)
		}
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			return fail(fmt.Errorf("devpg: bouncer: chown %s: %w", dir, err))
		}
	}
	b := &Bouncer{Dir: dir, Port: port, done: make(chan struct{})}
	bu := *u
	bu.Host = "127.0.0.1:" + strconv.Itoa(port)
	bq := url.Values{}
	if m := u.Query().Get("sslmode"); m != "" {
		bq.Set("sslmode", m)
	}
	bu.RawQuery = bq.Encode()
	b.URL = bu.String()
	b.cmd = exec.Command(bin, filepath.Join(dir, "pgbouncer.ini"))
	b.cmd.Dir = dir
	// Own process group, as for the clusters: a Ctrl-C aimed at the
	// parent must not end the pooler under a test that is still stopping.
	b.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: cred}
	if err := b.cmd.Start(); err != nil {
		return fail(fmt.Errorf("devpg: start pgbouncer: %w", err))
	}
	go func() { b.cmd.Wait(); close(b.done) }() //nolint:errcheck // its log says why
	if err := b.waitReady(ctx); err != nil {
		b.Stop() //nolint:errcheck
		return nil, err
	}
	return b, nil
}

// connectQuery is the connect_query clause of a [databases] entry for q,
// quoted as PgBouncer's connection strings quote.
func connectQuery(q string) string {
	if q == "" {
		return ""
	}
	return " connect_query='" + strings.ReplaceAll(q, "'", "''") + "'"
}

func (b *Bouncer) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		conn, err := pgx.Connect(ctx, b.URL)
		if err == nil {
			_, err = conn.Exec(ctx, "SELECT 1", pgx.QueryExecModeSimpleProtocol)
			conn.Close(ctx)
			if err == nil {
				return nil
			}
		}
		select {
		case <-b.done:
			log, _ := os.ReadFile(filepath.Join(b.Dir, "pgbouncer.log"))
			return fmt.Errorf("devpg: pgbouncer exited at start (%v):\n%s", b.cmd.ProcessState, log)
		case <-ctx.Done():
			log, _ := os.ReadFile(filepath.Join(b.Dir, "pgbouncer.log"))
			return fmt.Errorf("devpg: pgbouncer did not accept connections: %w\n%s", err, log)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Log returns what PgBouncer has logged so far.
func (b *Bouncer) Log() string {
	log, _ := os.ReadFile(filepath.Join(b.Dir, "pgbouncer.log"))
	return string(log)
}

// Stop ends PgBouncer (SIGINT: at once, cutting its clients) and removes
// its directory.
func (b *Bouncer) Stop() error {
	b.cmd.Process.Signal(syscall.SIGINT) //nolint:errcheck // gone already is fine
	select {
	case <-b.done:
	case <-time.After(10 * time.Second):
		b.cmd.Process.Kill() //nolint:errcheck
		<-b.done
	}
	return os.RemoveAll(b.Dir)
}

// reapBouncers ends the PgBouncers whose starting process died without
// stopping them, as reapOrphans does for clusters. Best effort.
func reapBouncers() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), "relay-pgbouncer-*"))
	for _, dir := range dirs {
		owner, err := readPID(filepath.Join(dir, ownerFile))
		if err != nil || alive(owner) {
			continue
		}
		if pid, err := readPID(filepath.Join(dir, "pgbouncer.pid")); err == nil && alive(pid) {
			cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
			if err != nil || !strings.Contains(string(cmdline), dir) {
				continue
			}
			syscall.Kill(pid, syscall.SIGKILL) //nolint:errcheck
		}
		os.RemoveAll(dir)
	}
}
