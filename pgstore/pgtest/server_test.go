package pgtest_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/polyloop/polyloop/pgstore/pgtest"
)

const childEnv = "PGTEST_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		srv, err := pgtest.Start(pgtest.Options{})
		if err != nil {
			fmt.Println("error", err)
			os.Exit(1)
		}
		fmt.Println(srv.Pid())
		time.Sleep(time.Hour) // until killed
	}
	os.Exit(pgtest.Main(m))
}

// TestAServerDiesWithItsTestProcess: a test process killed outright (as a
// test timeout or kill -9 would) takes its throwaway server with it.
func TestAServerDiesWithItsTestProcess(t *testing.T) {
	if os.Getenv(pgtest.DSNEnv) != "" {
		t.Skip("needs a throwaway server; " + pgtest.DSNEnv + " names a server of yours")
	}
	if _, err := pgtest.Lookup(); err != nil {
		pgtest.Unavailable(t, err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	pid, perr := strconv.Atoi(line[:max(len(line)-1, 0)])
	if err != nil || perr != nil {
		cmd.Process.Kill()
		t.Fatalf("child said %q: %v %v", line, err, perr)
	}
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	deadline := time.Now().Add(20 * time.Second)
	for syscall.Kill(pid, 0) == nil {
		if time.Now().After(deadline) {
			syscall.Kill(pid, syscall.SIGKILL)
			t.Fatalf("server %d outlived its killed test process", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestADurableServerKeepsFsyncOn: the benchmarks' server (DurableDSN) runs
// with fsync on and the tests' (DSN) with it off. (A misplaced option once
// made the durable server fail to start, and every PostgreSQL benchmark
// skipped without a word; such a failure now fails this test, see
// TestOnlyAMissingInstallationSkips.)
func TestADurableServerKeepsFsyncOn(t *testing.T) {
	if os.Getenv(pgtest.DSNEnv) != "" {
		t.Skip("the server is the one POLYLOOP_PG_DSN names")
	}
	for dsn, want := range map[string]string{pgtest.DurableDSN(t): "on", pgtest.DSN(t): "off"} {
		conn, err := pgx.Connect(context.Background(), dsn)
		if err != nil {
			t.Fatal(err)
		}
		var got string
		err = conn.QueryRow(context.Background(), "SHOW fsync").Scan(&got)
		conn.Close(context.Background())
		if err != nil || got != want {
			t.Errorf("fsync is %q (%v), want %q", got, err, want)
		}
	}
}

// TestATestsSchemaIsDroppedWhenItEnds: the schema Schema names for a test,
// with what the test made in it, is gone once the test ends — also when
// the connection the drops are made on was ended by the server meanwhile
// (a restart, an administrator), which the next drop survives.
func TestATestsSchemaIsDroppedWhenItEnds(t *testing.T) {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, pgtest.DSN(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	exists := func(name string) bool {
		var n int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_namespace WHERE nspname = $1`, name).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n > 0
	}
	for round := range 3 {
		var name string
		t.Run(fmt.Sprint("round ", round), func(t *testing.T) {
			name = pgtest.Schema(t)
			if _, err := conn.Exec(ctx, `CREATE SCHEMA `+pgx.Identifier{name}.Sanitize()+`; CREATE TABLE `+
				pgx.Identifier{name, "events"}.Sanitize()+` (id int)`); err != nil {
				t.Fatal(err)
			}
		})
		if exists(name) {
			t.Fatalf("round %d: schema %s is left after its test ended", round, name)
		}
		// Every other session ends, the one the drops are made on with it.
		if _, err := conn.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
			WHERE pid <> pg_backend_pid() AND backend_type = 'client backend'`); err != nil {
			t.Fatal(err)
		}
	}
}
