// Package seamstest holds test doubles for the seams: an in-memory RunStore
// (MemStore), a scripted model (Model), a line-oriented decision parser
// (Parser), a scripted executor that counts executions (Executor) and a
// recording sink (Sink). Like net/http/httptest, it is for tests, examples
// and demos; nothing here is durable.
package seamstest
