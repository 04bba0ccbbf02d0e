// Package devpg starts a throwaway PostgreSQL cluster from the local initdb
// and pg_ctl, for tests, the demo and the proof commands. It is development
// machinery, never used by the library itself.
//
// As root it runs the server as an unprivileged user (initdb refuses root),
// choosing "postgres" when that user exists and "nobody" otherwise.
package devpg

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// Options tune Start. The zero value is a durable cluster on a free port.
type Options struct {
	// Fast turns off fsync, full-page writes and synchronous commit: for
	// tests only, where a crash of the machine loses nothing anyone cares
	// about.
	Fast bool
	// Log receives a line for each step; nil is silent.
	Log func(format string, args ...any)
	// MaxConnections is the server's max_connections. Default 200.
	MaxConnections int
	// SynchronousCommit keeps synchronous_commit on under Fast (fsync stays
	// off): a commit then waits for a synchronous standby, which Fast alone
	// would not.
	SynchronousCommit bool
	// Dir, when set, is the cluster's directory instead of a fresh
	// temporary one: a cluster already there (stopped by Shutdown) is
	// started again with its data, else one is created there. Such a
	// cluster is never taken for an orphan (see Start); Stop still removes
	// it, Shutdown keeps it. As root, the server's user must be able to
	// reach Dir (a directory under os.TempDir() is).
	Dir string
}

// Cluster is a running throwaway cluster. Stop removes it.
type Cluster struct {
	Dir  string // holds data/, the socket and server.log
	Port int
	// URL connects as the superuser "postgres" to the "postgres" database.
	URL string

	bin  string
	cred *syscall.Credential
	opts Options
}

// ErrNoPostgres says no PostgreSQL server binaries were found.
var ErrNoPostgres = errors.New("devpg: no PostgreSQL server binaries (initdb, pg_ctl) found: install PostgreSQL (e.g. apt-get install postgresql) or set RELAY_TEST_DATABASE_URL / DATABASE_URL to a server")

// BinDir finds the directory holding initdb and pg_ctl: PATH first (links
// followed), then the Debian layout /usr/lib/postgresql/<version>/bin
// (newest version first).
func BinDir() (string, error) {
	if p, err := exec.LookPath("pg_ctl"); err == nil {
		if _, err := exec.LookPath("initdb"); err == nil {
			// A symlink on PATH (/usr/local/bin/pg_ctl) stands for its
			// installation, whose directory also has pg_basebackup.
			if real, err := filepath.EvalSymlinks(p); err == nil {
				p = real
			}
			return filepath.Dir(p), nil
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return versionOf(dirs[i]) > versionOf(dirs[j]) })
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d, nil
		}
	}
	return "", ErrNoPostgres
}

func versionOf(binDir string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return v
}

// Start creates and starts a new cluster in a fresh temporary directory.
func Start(ctx context.Context, opts Options) (*Cluster, error) {
	bin, err := BinDir()
	if err != nil {
		return nil, err
	}
	reapOrphans(opts.Log)
	if opts.Dir != "" {
		if _, err := os.Stat(filepath.Join(opts.Dir, "data", "PG_VERSION")); err == nil {
			return restart(ctx, bin, opts)
		}
		if err := os.MkdirAll(opts.Dir, 0o755); err != nil {
			return nil, fmt.Errorf("devpg: %w", err)
		}
	}
	dir := opts.Dir
	if dir == "" {
		if dir, err = os.MkdirTemp("", "relay-pg-"); err != nil {
			return nil, fmt.Errorf("devpg: temp dir: %w", err)
		}
		// Only a temporary cluster has an owner to outlive (see
		// reapOrphans).
		if err := os.WriteFile(filepath.Join(dir, ownerFile), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("devpg: %w", err)
		}
	}
	c := &Cluster{Dir: dir, bin: bin, opts: opts}
	if os.Geteuid() == 0 {
		cred, err := unprivileged()
		if err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		c.cred = cred
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("devpg: chown %s: %w", dir, err)
		}
	}
	c.logf("devpg: initdb in %s", dir)
	if out, err := c.run(ctx, "initdb", "-D", c.dataDir(), "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync", "--locale=C"); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("devpg: initdb: %w\n%s", err, out)
	}
	port, err := freePort()
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	c.Port = port
	c.URL = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port)
	if err := c.Start(ctx); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return c, nil
}

// restart starts the cluster kept in opts.Dir on a free port, first
// stopping a server still running there (its process was killed).
func restart(ctx context.Context, bin string, opts Options) (*Cluster, error) {
	c := &Cluster{Dir: opts.Dir, bin: bin, opts: opts}
	if os.Geteuid() == 0 {
		cred, err := unprivileged()
		if err != nil {
			return nil, err
		}
		c.cred = cred
	}
	if pid, err := readPID(filepath.Join(c.dataDir(), "postmaster.pid")); err == nil && alive(pid) {
		c.run(ctx, "pg_ctl", "-D", c.dataDir(), "-m", "fast", "-w", "stop") //nolint:errcheck // the start below says what is wrong
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	c.Port = port
	c.URL = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port)
	if err := c.Start(ctx); err != nil {
		return nil, err
	}
	return c, nil
}

// Discard stops the server of the cluster kept in dir, if one runs, and
// removes dir: for a caller of Start with Options.Dir that wants a fresh
// cluster there.
func Discard(dir string) error {
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if pid, err := readPID(filepath.Join(dir, "data", "postmaster.pid")); err == nil && alive(pid) {
		bin, err := BinDir()
		if err != nil {
			return err
		}
		c := &Cluster{Dir: dir, bin: bin}
		if os.Geteuid() == 0 {
			if c.cred, err = unprivileged(); err != nil {
				return err
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		if out, err := c.run(ctx, "pg_ctl", "-D", c.dataDir(), "-m", "immediate", "-w", "stop"); err != nil {
			return fmt.Errorf("devpg: stop the cluster in %s: %w\n%s", dir, err, out)
		}
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("devpg: %w", err)
	}
	return nil
}

// Shutdown stops the server with a fast shutdown and keeps the cluster's
// directory, for Start with Options.Dir to start again.
func (c *Cluster) Shutdown() error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if out, err := c.run(ctx, "pg_ctl", "-D", c.dataDir(), "-m", "fast", "-w", "stop"); err != nil {
		return fmt.Errorf("devpg: pg_ctl stop: %w\n%s", err, out)
	}
	return nil
}

func (c *Cluster) dataDir() string { return filepath.Join(c.Dir, "data") }

// Start starts the server of an existing cluster (after Stop with keep, or a
// crash) and waits until it accepts connections.
func (c *Cluster) Start(ctx context.Context) error {
	settings := []string{
		"-p", strconv.Itoa(c.Port),
		"-k", c.Dir,
		"-c", "listen_addresses=127.0.0.1",
		"-c", "max_connections=" + strconv.Itoa(cmp.Or(c.opts.MaxConnections, 200)),
		"-c", "shared_buffers=256MB",
	}
	if c.opts.Fast {
		settings = append(settings, "-c", "fsync=off", "-c", "full_page_writes=off")
		if !c.opts.SynchronousCommit {
			settings = append(settings, "-c", "synchronous_commit=off")
		}
	}
	c.logf("devpg: starting on 127.0.0.1:%d", c.Port)
	if out, err := c.run(ctx, "pg_ctl", "-D", c.dataDir(), "-l", filepath.Join(c.Dir, "server.log"), "-w", "-t", "60",
		"-o", strings.Join(settings, " "), "start"); err != nil {
		log, _ := os.ReadFile(filepath.Join(c.Dir, "server.log"))
		return fmt.Errorf("devpg: pg_ctl start: %w\n%s\n%s", err, out, log)
	}
	return c.waitReady(ctx)
}

func (c *Cluster) waitReady(ctx context.Context) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		conn, err := pgx.Connect(ctx, c.URL)
		if err == nil {
			conn.Close(ctx)
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("devpg: server did not accept connections: %w", err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Restart stops the server with a fast shutdown and starts it again, as an
// operator's restart would: sessions are cut, nothing committed is lost.
func (c *Cluster) Restart(ctx context.Context) error {
	if out, err := c.run(ctx, "pg_ctl", "-D", c.dataDir(), "-m", "fast", "-w", "stop"); err != nil {
		return fmt.Errorf("devpg: pg_ctl stop: %w\n%s", err, out)
	}
	return c.Start(ctx)
}

// Crash stops the server the way a crash would (immediate shutdown: no
// checkpoint, recovery from WAL at the next start), then starts it again.
func (c *Cluster) Crash(ctx context.Context) error {
	if out, err := c.run(ctx, "pg_ctl", "-D", c.dataDir(), "-m", "immediate", "-w", "stop"); err != nil {
		return fmt.Errorf("devpg: pg_ctl stop -m immediate: %w\n%s", err, out)
	}
	return c.Start(ctx)
}

// Stop stops the server (if it runs: Kill may have stopped it) and removes
// the cluster's directory.
func (c *Cluster) Stop() error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var out []byte
	var err error
	if _, statErr := os.Stat(filepath.Join(c.dataDir(), "postmaster.pid")); statErr == nil {
		out, err = c.run(ctx, "pg_ctl", "-D", c.dataDir(), "-m", "immediate", "-w", "stop")
	}
	rmErr := os.RemoveAll(c.Dir)
	if err != nil {
		return fmt.Errorf("devpg: pg_ctl stop: %w\n%s", err, out)
	}
	return rmErr
}

func (c *Cluster) run(ctx context.Context, name string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(c.bin, name), args...)
	cmd.Dir = c.Dir
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	// Own process group: a Ctrl-C aimed at the parent must not kill the server
	// before the parent stops it cleanly.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: c.cred}
	return cmd.CombinedOutput()
}

func (c *Cluster) logf(format string, args ...any) {
	if c.opts.Log != nil {
		c.opts.Log(format, args...)
	}
}

func unprivileged() (*syscall.Credential, error) {
	for _, name := range []string{"postgres", "nobody"} {
		u, err := user.Lookup(name)
		if err != nil {
			continue
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
	}
	return nil, errors.New("devpg: running as root and neither user postgres nor nobody exists to run initdb as")
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("devpg: find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// ownerFile, in a cluster's directory, holds the PID of the process that
// started it.
const ownerFile = "owner.pid"

// reapOrphans stops and removes the clusters whose starting process has
// died without stopping them: a test binary killed by go test's timeout, a
// panic, a SIGKILL. Their servers run in process groups of their own and
// would otherwise run until the machine stops. A cluster without an owner
// file (being created, or made by an older version) or whose owner is
// alive is left alone; so is a server whose command line does not name
// the cluster's directory (its PID reused by another process). Best
// effort: errors are logged, never returned.
func reapOrphans(log func(string, ...any)) {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), "relay-pg-*"))
	for _, dir := range dirs {
		owner, err := readPID(filepath.Join(dir, ownerFile))
		if err != nil || alive(owner) {
			continue
		}
		if pid, err := readPID(filepath.Join(dir, "data", "postmaster.pid")); err == nil && alive(pid) {
			cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
			if err != nil || !strings.Contains(string(cmdline), dir) {
				continue
			}
			syscall.Kill(pid, syscall.SIGQUIT) //nolint:errcheck // immediate shutdown
			for deadline := time.Now().Add(10 * time.Second); alive(pid) && time.Now().Before(deadline); {
				time.Sleep(50 * time.Millisecond)
			}
			if alive(pid) {
				continue
			}
		}
		if err := os.RemoveAll(dir); err != nil && log != nil {
			log("devpg: remove the orphaned cluster %s: %v", dir, err)
		} else if log != nil {
			log("devpg: removed the orphaned cluster %s (its process %d is gone)", dir, owner)
		}
	}
}

// readPID reads the PID on the first line of a file.
func readPID(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil || pid <= 0 {
		return 0, fmt.Errorf("devpg: no PID in %s", path)
	}
	return pid, nil
}

// alive says whether a process exists (EPERM: it does, another user's).
func alive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}
