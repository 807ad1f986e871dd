package kvtest

import (
	"bytes"
	"fmt"

	"github.com/polyloop/polyloop/kv/internal/boltpage"
)

// Damaged is one damaged copy of a store file.
type Damaged struct {
	Name string
	// Kind is the way it is damaged, Name without the place: "bit
	// flipped", "truncated at a page", "meta page 1: txid damaged"…
	Kind  string
	Bytes []byte
	// Torn marks a copy taken while a writer wrote: its runs may hold a
	// prefix of what was finally written.
	Torn bool
}

// DamageCorpus derives damaged copies of a sound bbolt store file, the
// ways disks and careless copies damage files: a bit flipped at every
// 64th byte (a different bit each time), the file truncated at and inside
// every page, each page zeroed, and each field of both meta pages damaged.
func DamageCorpus(file []byte) ([]Damaged, error) { return DamageSample(file, 1) }

// DamageSample is Sample(DamageCorpus(file), n) without making the copies
// it leaves out: a test that needs a few of a large file's thousands of
// copies does not clone the file thousands of times.
func DamageSample(file []byte, n int) ([]Damaged, error) {
	const meta = boltpage.HeaderSize // where a meta page's fields begin
	if len(file) < meta+boltpage.MetaSize {
		return nil, fmt.Errorf("kvtest: a %d-byte file is no bbolt store", len(file))
	}
	ps := int(boltpage.Order.Uint32(file[meta+boltpage.MetaPageSize:])) // the first meta page's page size
	if ps < 1024 || len(file)%ps != 0 {
		return nil, fmt.Errorf("kvtest: page size %d does not fit a %d-byte file", ps, len(file))
	}
	var out []Damaged
	seen := map[string]int{}
	add := func(kind, name string, damage func() []byte) {
		if seen[kind]%max(n, 1) == 0 {
			out = append(out, Damaged{Name: name, Kind: kind, Bytes: damage()})
		}
		seen[kind]++
	}
	flipped := func(off int, mask byte) func() []byte {
		return func() []byte {
			b := bytes.Clone(file)
			b[off] ^= mask
			return b
		}
	}
	for off := 0; off < len(file); off += 64 {
		bit := off / 64 % 8
		add("bit flipped", fmt.Sprintf("bit %d of byte %d flipped", bit, off), flipped(off, 1<<bit))
	}
	for p := 0; p < len(file)/ps; p++ {
		add("truncated at a page", fmt.Sprintf("truncated at page %d", p), func() []byte { return bytes.Clone(file[:p*ps]) })
		add("truncated inside a page", fmt.Sprintf("truncated inside page %d", p), func() []byte { return bytes.Clone(file[:p*ps+ps/2]) })
		add("page zeroed", fmt.Sprintf("page %d zeroed", p), func() []byte {
			b := bytes.Clone(file)
			clear(b[p*ps : (p+1)*ps])
			return b
		})
	}
	for m := range 2 {
		for _, f := range []struct {
			name string
			off  int
		}{{"magic", boltpage.MetaMagic}, {"page size", boltpage.MetaPageSize}, {"root", boltpage.MetaRoot},
			{"freelist", boltpage.MetaFreelist}, {"high-water mark", boltpage.MetaPgid}, {"txid", boltpage.MetaTxid},
			{"checksum", boltpage.MetaChecksum}} {
			name := fmt.Sprintf("meta page %d: %s damaged", m, f.name)
			add(name, name, flipped(m*ps+meta+f.off, 0x11))
		}
	}
	return out, nil
}

// Sample returns every nth copy of each kind of damage in corpus
// (Damaged.Kind; each meta field of each meta page is a kind of its own),
// always the first of each, in corpus order — so a test that cannot
// afford the whole corpus still meets every way a file is damaged. An n
// below 2 returns corpus.
func Sample(corpus []Damaged, n int) []Damaged {
	if n < 2 {
		return corpus
	}
	seen := map[string]int{}
	var out []Damaged
	for _, d := range corpus {
		if seen[d.Kind]%n == 0 {
			out = append(out, d)
		}
		seen[d.Kind]++
	}
	return out
}
