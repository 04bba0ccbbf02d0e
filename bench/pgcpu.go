package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// PostgresCPU returns the CPU time (user + system) PostgreSQL's processes
// have used so far: the postmaster's own, its live children's, and that of
// children already reaped (backends that exited). It works when the server
// runs on this machine and /proc is readable; otherwise it errors.
func PostgresCPU(ctx context.Context, pool *pgxpool.Pool) (time.Duration, error) {
	var pid int
	if err := pool.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		return 0, err
	}
	st, err := procStat(pid)
	if err != nil {
		return 0, fmt.Errorf("postgres cpu: %w (is the server on this machine?)", err)
	}
	post := st.ppid
	pst, err := procStat(post)
	if err != nil || !strings.HasPrefix(pst.comm, "postgres") {
		return 0, fmt.Errorf("postgres cpu: parent %d of backend %d is not postgres", post, pid)
	}
	ticks := pst.utime + pst.stime + pst.cutime + pst.cstime
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		p, err := strconv.Atoi(filepath.Base(d))
		if err != nil || p == post {
			continue
		}
		if s, err := procStat(p); err == nil && s.ppid == post {
			ticks += s.utime + s.stime + s.cutime + s.cstime
		}
	}
	return time.Duration(ticks) * time.Second / 100, nil // USER_HZ is 100 on Linux
}

type stat struct {
	comm                         string
	ppid                         int
	utime, stime, cutime, cstime int64
}

func procStat(pid int) (stat, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return stat{}, err
	}
	s := string(b)
	open, close := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || close < open {
		return stat{}, fmt.Errorf("bad /proc/%d/stat", pid)
	}
	f := strings.Fields(s[close+1:]) // f[0] is field 3 (state)
	if len(f) < 15 {
		return stat{}, fmt.Errorf("short /proc/%d/stat", pid)
	}
	n := func(i int) int64 { v, _ := strconv.ParseInt(f[i-3], 10, 64); return v }
	return stat{comm: s[open+1 : close], ppid: int(n(4)), utime: n(14), stime: n(15), cutime: n(16), cstime: n(17)}, nil
}
