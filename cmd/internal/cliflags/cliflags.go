// Package cliflags lets PolyLoop's commands take their flags before or
// after their positional arguments (the standard flag package stops at the
// first positional one): Parse separates the two by the flag set's own
// definitions, then parses the flags.
//
// What does not live here: the commands' flags, help texts and exit codes.
package cliflags

import (
	"flag"
	"strings"
)

// Parse parses the flags among args into fs, wherever they stand, and
// returns the positional arguments in order. A flag fs defines as taking a
// value takes the next argument when it is not written -name=value; every
// argument after "--" is positional (a run id may start with a dash). Its
// error is fs.Parse's (flag.ErrHelp for -h and --help).
func Parse(fs *flag.FlagSet, args []string) (positional []string, err error) {
	var flags []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			positional = append(positional, args[i+1:]...)
			break
		}
		if !strings.HasPrefix(a, "-") || a == "-" {
			positional = append(positional, a)
			continue
		}
		flags = append(flags, a)
		name := strings.TrimLeft(a, "-")
		if f := fs.Lookup(name); f != nil && !strings.Contains(name, "=") && !isBool(f) && i+1 < len(args) {
			i++
			flags = append(flags, args[i])
		}
	}
	return positional, fs.Parse(flags)
}

func isBool(f *flag.Flag) bool {
	b, ok := f.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}
