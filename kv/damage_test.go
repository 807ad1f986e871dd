package kv_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/polyloop/polyloop/kv"
)

// damaged is one damaged copy of a store file.
type damaged struct {
	name  string
	bytes []byte
}

// pageSizeOf reads a bbolt file's page size from its first meta page.
func pageSizeOf(t testing.TB, file []byte) int {
	t.Helper()
	ps := int(binary.NativeEndian.Uint32(file[16+8:]))
	if ps < 1024 || len(file)%ps != 0 {
		t.Fatalf("unexpected page size %d for a %d-byte file", ps, len(file))
	}
	return ps
}

// damageCorpus derives damaged copies of a sound store file: a bit flipped
// at every stride-th byte, truncations at and between page boundaries,
// each page zeroed, and each meta page's checksum, magic and transaction
// id damaged. every keeps one copy in every (a sample; 1 keeps all).
func damageCorpus(t testing.TB, file []byte, stride, every int) []damaged {
	ps := pageSizeOf(t, file)
	var out []damaged
	add := func(name string, b []byte) { out = append(out, damaged{name, b}) }
	for off := 0; off < len(file); off += stride {
		b := bytes.Clone(file)
		b[off] ^= 1 << (off / stride % 8)
		add(fmt.Sprintf("bit %d of byte %d flipped", off/stride%8, off), b)
	}
	for p := 0; p <= len(file)/ps; p++ {
		for _, cut := range []int{p * ps, p*ps + ps/2} {
			if cut < len(file) {
				add(fmt.Sprintf("truncated to %d bytes", cut), bytes.Clone(file[:cut]))
			}
		}
	}
	for p := 0; p < len(file)/ps; p++ {
		b := bytes.Clone(file)
		clear(b[p*ps : (p+1)*ps])
		add(fmt.Sprintf("page %d zeroed", p), b)
	}
	for m := range 2 {
		for _, field := range []struct {
			name string
			off  int
		}{{"magic", 16}, {"root", 16 + 16}, {"txid", 16 + 48}, {"checksum", 16 + 56}} {
			b := bytes.Clone(file)
			b[m*ps+field.off] ^= 0x40
			add(fmt.Sprintf("meta page %d: %s damaged", m, field.name), b)
		}
	}
	if every <= 1 {
		return out
	}
	var sample []damaged
	for i := 0; i < len(out); i += every {
		sample = append(sample, out[i])
	}
	return sample
}

// openFDs counts this process's open descriptors.
func openFDs(t testing.TB) int {
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("no /proc/self/fd: %v", err)
	}
	return len(entries)
}

// mapped reports whether this process maps path.
func mapped(t testing.TB, path string) bool {
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Skipf("no /proc/self/maps: %v", err)
	}
	return strings.Contains(string(maps), path)
}

// TestARefusedOpenReleasesTheFile: every damaged copy that Open refuses is
// refused again — read-only and read-write, in either order — with the same
// kind of error, never ErrLocked; and afterwards the process holds no more
// descriptors than before and no mapping of the file.
func TestARefusedOpenReleasesTheFile(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.db")
	writeSampleStore(t, good)
	whole, err := os.ReadFile(good)
	if err != nil {
		t.Fatal(err)
	}
	corpus := damageCorpus(t, whole, 64, 7)
	refused, locked := 0, 0
	for i, d := range corpus {
		path := filepath.Join(dir, fmt.Sprintf("d%04d.db", i))
		if err := os.WriteFile(path, d.bytes, 0o600); err != nil {
			t.Fatal(err)
		}
		fds := openFDs(t)
		var first error
		for _, ro := range []bool{true, false, true, false} {
			s, err := kv.Open(path, kv.Options{ReadOnly: ro, LockTimeout: 50e6})
			if err == nil {
				s.Close()
				continue
			}
			if errors.Is(err, kv.ErrLocked) {
				locked++
				t.Errorf("%s: read-only %t: %v", d.name, ro, err)
				continue
			}
			if first == nil {
				first = err
				refused++
			} else if errors.Is(first, kv.ErrCorrupt) != errors.Is(err, kv.ErrCorrupt) {
				t.Errorf("%s: refused first with %v, then with %v", d.name, first, err)
			}
		}
		if got := openFDs(t); got != fds {
			t.Errorf("%s: %d descriptors open before, %d after", d.name, fds, got)
		}
		if mapped(t, path) {
			t.Errorf("%s: the file is still mapped", d.name)
		}
		os.Remove(path)
	}
	t.Logf("%d damaged copies: %d refused, %d opens found the file locked", len(corpus), refused, locked)
}
