// Package buildinfo is the commands' --version line: the module's version
// and the VCS revision, time and modified flag the go command stamps into
// a binary it builds (runtime/debug.ReadBuildInfo), on one line.
//
// `go install ./cmd/...` and `go build` in a clone stamp the revision;
// `go install …@vX.Y.Z` stamps the module version; `go run` and `go test`
// stamp neither, and the line says "(devel)" with no revision.
package buildinfo

import (
	"fmt"
	"runtime/debug"
	"strings"
)

// Line is what `name --version` prints: "NAME MODULE VERSION (revision
// R, T, modified) GOVERSION", the parenthesis only when a revision was
// stamped, "modified" only when the working tree had changes.
func Line(name string) string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return name + " (no build information in this binary)"
	}
	return line(name, info)
}

func line(name string, info *debug.BuildInfo) string {
	version := info.Main.Version
	if version == "" {
		version = "(devel)"
	}
	s := fmt.Sprintf("%s %s %s", name, info.Main.Path, version)
	settings := map[string]string{}
	for _, kv := range info.Settings {
		settings[kv.Key] = kv.Value
	}
	if rev := settings["vcs.revision"]; rev != "" {
		vcs := []string{"revision " + rev}
		if t := settings["vcs.time"]; t != "" {
			vcs = append(vcs, t)
		}
		if settings["vcs.modified"] == "true" {
			vcs = append(vcs, "modified")
		}
		s += " (" + strings.Join(vcs, ", ") + ")"
	}
	return s + " " + info.GoVersion
}
