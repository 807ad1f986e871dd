package kvtest_test

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/polyloop/polyloop/kv"
	"github.com/polyloop/polyloop/kv/kvtest"
)

// TestTheCorpusRefusesWhatIsNoStore: a file too short for a meta page, or
// whose page size does not divide it, is an error naming what is wrong.
func TestTheCorpusRefusesWhatIsNoStore(t *testing.T) {
	for _, c := range []struct {
		name string
		file []byte
		want string
	}{
		{"shorter than a meta page", make([]byte, 40), "kvtest: a 40-byte file is no bbolt store"},
		{"no page size", make([]byte, 4096), "kvtest: page size 0 does not fit a 4096-byte file"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if _, err := kvtest.DamageCorpus(c.file); err == nil || err.Error() != c.want {
				t.Fatalf("got %v, want %q", err, c.want)
			}
		})
	}
}

// TestEachCopyIsDamagedWhereItsNameSays: a flipped bit differs from the
// file in that byte alone, a damaged meta field in the field's first byte
// on its page, a zeroed page only inside that page, a truncated copy is
// the file's prefix; and the corpus holds every kind for every page.
func TestEachCopyIsDamagedWhereItsNameSays(t *testing.T) {
	file, corpus := emptyStoreCorpus(t)
	const ps = kv.DefaultPageSize
	// The meta fields as bbolt lays them out after a page's 16-byte header.
	metaField := map[string]int{"magic": 16, "page size": 24, "root": 32, "freelist": 48, "high-water mark": 56, "txid": 64, "checksum": 72}
	kinds := map[string]int{}
	for _, d := range corpus {
		var kind string
		var off, page int
		var field string
		switch {
		case scan(d.Name, "bit %d of byte %d flipped", &page, &off):
			kind = "bit"
		case scan(d.Name, "truncated at page %d", &page):
			kind, off = "truncated", page*ps
		case scan(d.Name, "truncated inside page %d", &page):
			kind, off = "truncated", page*ps+ps/2
		case scan(d.Name, "page %d zeroed", &page):
			kind = "zeroed"
		case strings.HasPrefix(d.Name, "meta page "):
			kind = "meta"
			rest, _ := strings.CutSuffix(d.Name[len("meta page 0: "):], " damaged")
			page, field = int(d.Name[len("meta page ")]-'0'), rest
			f, ok := metaField[field]
			if !ok {
				t.Fatalf("%s: no such meta field", d.Name)
			}
			off = page*ps + f
		default:
			t.Fatalf("a copy named %q", d.Name)
		}
		kinds[kind]++
		b := d.Bytes
		switch kind {
		case "bit", "meta":
			if len(b) != len(file) || b[off] == file[off] || !bytes.Equal(b[:off], file[:off]) || !bytes.Equal(b[off+1:], file[off+1:]) {
				t.Errorf("%s: not the file with byte %d alone changed", d.Name, off)
			}
		case "truncated":
			if !bytes.Equal(b, file[:off]) {
				t.Errorf("%s: %d bytes, not the file's first %d", d.Name, len(b), off)
			}
		case "zeroed":
			lo, hi := page*ps, (page+1)*ps
			if len(b) != len(file) || !bytes.Equal(b[:lo], file[:lo]) || !bytes.Equal(b[hi:], file[hi:]) || !bytes.Equal(b[lo:hi], make([]byte, ps)) {
				t.Errorf("%s: not the file with page %d zeroed", d.Name, page)
			}
		}
	}
	pages := len(file) / ps
	want := map[string]int{"bit": (len(file) + 63) / 64, "truncated": 2 * pages, "zeroed": pages, "meta": 2 * len(metaField)}
	if fmt.Sprint(kinds) != fmt.Sprint(want) {
		t.Fatalf("the corpus of a %d-page file holds %v, want %v", pages, kinds, want)
	}
}

// scan reports whether name is format with its numbers filled in.
func scan(name, format string, a ...any) bool {
	n, err := fmt.Sscanf(name, format, a...)
	return err == nil && n == len(a) && fmt.Sprintf(format, deref(a)...) == name
}

func deref(a []any) []any {
	out := make([]any, len(a))
	for i, p := range a {
		out[i] = *p.(*int)
	}
	return out
}

// TestASampleMeetsEveryKindOfDamage: a sample keeps the first copy of
// each kind and every nth after it, so a test at a small count still
// meets bit flips, truncations, zeroed pages and each meta field.
func TestASampleMeetsEveryKindOfDamage(t *testing.T) {
	_, corpus := emptyStoreCorpus(t)
	if got := kvtest.Sample(corpus, 1); len(got) != len(corpus) {
		t.Fatalf("Sample(corpus, 1) kept %d of %d", len(got), len(corpus))
	}
	sample := kvtest.Sample(corpus, 16)
	names := map[string]bool{}
	for _, d := range sample {
		names[d.Name] = true
	}
	want := []string{"bit 0 of byte 0 flipped", "bit 0 of byte 1024 flipped", "truncated at page 0", "truncated inside page 0",
		"page 0 zeroed", "meta page 0: magic damaged", "meta page 1: checksum damaged", "meta page 0: txid damaged"}
	for _, name := range want {
		if !names[name] {
			t.Errorf("the sample lacks %q", name)
		}
	}
	for _, name := range []string{"bit 1 of byte 64 flipped", "truncated at page 1", "page 1 zeroed"} {
		if names[name] {
			t.Errorf("the sample holds %q, the second of its kind", name)
		}
	}
	if len(sample) >= len(corpus)/4 {
		t.Errorf("a sample of every 16th kept %d of %d copies", len(sample), len(corpus))
	}
}

// TestDamageSampleIsTheSampleOfTheCorpus: DamageSample makes exactly the
// copies Sample keeps of the whole corpus, byte for byte.
func TestDamageSampleIsTheSampleOfTheCorpus(t *testing.T) {
	file, corpus := emptyStoreCorpus(t)
	for _, n := range []int{2, 7, 64} {
		want := kvtest.Sample(corpus, n)
		got, err := kvtest.DamageSample(file, n)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != len(want) {
			t.Fatalf("DamageSample(file, %d): %d copies, Sample of the corpus %d", n, len(got), len(want))
		}
		for i := range got {
			if got[i].Name != want[i].Name || got[i].Kind != want[i].Kind || !bytes.Equal(got[i].Bytes, want[i].Bytes) {
				t.Fatalf("DamageSample(file, %d)[%d] is %q, Sample's %q (or their bytes differ)", n, i, got[i].Name, want[i].Name)
			}
		}
	}
}

// emptyStoreCorpus is a new, empty store file and its damage corpus,
// made once for the tests that only read them (several thousand copies:
// seconds under the race detector).
func emptyStoreCorpus(t *testing.T) ([]byte, []kvtest.Damaged) {
	t.Helper()
	corpusOnce.Do(func() {
		dir, err := os.MkdirTemp("", "kvtest-")
		if err != nil {
			corpusErr = err
			return
		}
		defer os.RemoveAll(dir)
		if corpusFile, corpusErr = storeFile(dir); corpusErr == nil {
			corpus, corpusErr = kvtest.DamageCorpus(corpusFile)
		}
	})
	if corpusErr != nil {
		t.Fatal(corpusErr)
	}
	return corpusFile, corpus
}

var (
	corpusOnce sync.Once
	corpusFile []byte
	corpus     []kvtest.Damaged
	corpusErr  error
)

// storeFile writes a new, empty store in dir and returns its bytes.
func storeFile(dir string) ([]byte, error) {
	path := filepath.Join(dir, "s.db")
	s, err := kv.Open(path, kv.Options{})
	if err != nil {
		return nil, err
	}
	if err := s.Close(); err != nil {
		return nil, err
	}
	return os.ReadFile(path)
}
