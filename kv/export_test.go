package kv

// FormatBuckets makes o create a format 1 store (a nested bucket per run),
// as versions before the log wrote them, for tests of files made then.
func FormatBuckets(o Options) Options {
	o.format = formatBuckets
	return o
}
