// Command polyloop-demo runs a small tool agent to completion on a bbolt
// store file in the working directory, offline: the model is scripted, the
// tools are real (they list, read and count words in files of a sample
// folder the demo writes). It prints a line per step as the step becomes
// durable (package progress), then the result and where the store is, so
// polyloop-inspect can show what happened. Its agent is built by package
// cmd/internal/demo, which polyloop-admin fork rebuilds to fork a demo run.
//
//	polyloop-demo [-store polyloop-demo.db | -store postgres://…] [-run RUN_ID]
//	polyloop-demo -version
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/polyloop/polyloop/cmd/internal/buildinfo"
	"github.com/polyloop/polyloop/cmd/internal/demo"
	"github.com/polyloop/polyloop/engine"
	"github.com/polyloop/polyloop/progress"
	"github.com/polyloop/polyloop/stores"
)

func main() {
	storePath := flag.String("store", "polyloop-demo.db", "bbolt store file or PostgreSQL connection string (postgres:// URL or key=value)")
	runID := flag.String("run", "", "run id (default: demo-<time>)")
	version := flag.Bool("version", false, "print the module version and VCS revision this binary was built from")
	flag.Parse()
	if *version {
		fmt.Println(buildinfo.Line("polyloop-demo"))
		return
	}
	if *runID == "" {
		*runID = "demo-" + time.Now().UTC().Format("20060102T150405.000")
	}
	if err := run(*storePath, *runID); err != nil {
		fmt.Fprintln(os.Stderr, "polyloop-demo:", err)
		os.Exit(1)
	}
}

func run(storePath, runID string) error {
	folder, err := demo.Folder()
	if err != nil {
		return err
	}
	defer os.RemoveAll(folder)
	store, err := stores.Open(context.Background(), storePath, stores.Options{})
	if err != nil {
		return err
	}
	defer store.Close()
	def, req, err := demo.Agent(store, folder, runID, demo.Replies)
	if err != nil {
		return err
	}
	def.Events = progress.New(os.Stdout) // a line per step as it becomes durable
	result, err := engine.Run(context.Background(), def, req)
	if err != nil {
		return err
	}
	demo.Print(os.Stdout, result)
	fmt.Printf("store: %s\n", stores.Describe(storePath))
	return nil
}
