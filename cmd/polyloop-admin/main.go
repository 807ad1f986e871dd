// Command polyloop-admin changes a PolyLoop store: it deletes runs and
// compacts files. (polyloop-inspect only reads; the writing verbs live
// here, in a command named for them.)
//
//	polyloop-admin delete [--force] STORE RUN...         delete finished runs (--force: unfinished too)
//	polyloop-admin gc --finished-before 720h STORE       delete finished runs whose last event is older
//	polyloop-admin compact STORE                         rewrite a bbolt file without its free pages, in the current format
//
// STORE is a bbolt file or a PostgreSQL connection string (a postgres://
// URL or a key=value string). Exit status: 0 done, 1 a
// problem (a run refused, the store unreadable), 2 bad usage.
package main

import (
	"os"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }
