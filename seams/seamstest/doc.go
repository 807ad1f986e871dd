// Package seamstest holds test doubles for the seams: an in-memory RunStore
// (MemStore), a line-oriented decision parser (Parser), a scripted executor
// that counts executions (Executor), a recording sink (Sink), gates that
// hold a call (Gate, PausingModel, PausingExecutor), and the scripted model
// under its test name (Model is scripted.Model). Like net/http/httptest, it
// is for tests; nothing here is durable, and no command or example links it
// (the root's deps_test.go checks): a program that needs an offline model
// uses package scripted, and a parser from package parsers.
package seamstest
