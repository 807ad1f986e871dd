package kv

import (
	"bytes"
	"fmt"
	"hash/fnv"
	"io"
	"os"

	"github.com/polyloop/polyloop/kv/internal/boltpage"
)

// The file check. bbolt trusts its file: it maps it and follows page ids,
// offsets and lengths as it finds them, so a damaged page makes it fault
// on memory past the end of the file, or panic — with the freelist not
// synced, in a goroutine of its own when it rebuilds the freelist by walking
// every page, where no recover can reach. It also falls back to the older
// meta page without a word when the newest one is damaged, which silently
// drops the last committed transaction.
//
// So before bbolt sees a file, checkFile reads it — through a read-only
// mapping of its own, or with reads where there is none; it touches a page
// only once the meta page proved the page inside the file, and runs with
// faults turned into errors — and proves what bbolt will rely on: both
// meta pages valid (magic, version, checksum, the page that the
// transaction id puts them on), the file as long as the newest meta's
// high-water mark says, and every page reachable from the root — through
// branch and leaf pages, nested and inline buckets — in bounds, of the
// right type, referenced once, with every element inside its page, element
// data laid out in order without overlap, keys non-empty and in order
// within and across pages, and a synced freelist listing no page in use:
// the checks bbolt's own consistency walk makes (tx_check.go) and the
// layout bbolt writes, so the walk it runs when it rebuilds the freelist
// finds nothing to panic about. The format is bbolt's on-disk
// format version 2, in the machine's byte order, as bbolt writes it; its
// offsets, sizes and flags are package boltpage's.

// maxNesting bounds the depth of the walk (tree levels plus nested
// buckets); sound stores are a few levels deep.
const maxNesting = 256

// order is the file's byte order (package boltpage holds the format).
var order = boltpage.Order

// meta is a parsed bbolt meta page.
type meta struct {
	page                                      int
	magic, version, pageSize                  uint32
	root, freelist, pgid, txid, checksum, sum uint64
}

func parseMeta(page int, b []byte) meta {
	m := meta{page: page}
	if len(b) < boltpage.HeaderSize+boltpage.MetaSize {
		return m
	}
	b = b[boltpage.HeaderSize:]
	m.magic = order.Uint32(b[boltpage.MetaMagic:])
	m.version = order.Uint32(b[boltpage.MetaVersion:])
	m.pageSize = order.Uint32(b[boltpage.MetaPageSize:])
	m.root = order.Uint64(b[boltpage.MetaRoot:])
	m.freelist = order.Uint64(b[boltpage.MetaFreelist:])
	m.pgid = order.Uint64(b[boltpage.MetaPgid:])
	m.txid = order.Uint64(b[boltpage.MetaTxid:])
	m.checksum = order.Uint64(b[boltpage.MetaChecksum:])
	h := fnv.New64a()
	h.Write(b[:boltpage.MetaChecksum])
	m.sum = h.Sum64()
	return m
}

// bboltValid reports whether bbolt itself would use this meta page: it
// checks only magic, version and checksum.
func (m meta) bboltValid() bool {
	return m.magic == boltpage.Magic && m.version == boltpage.Version && m.checksum == m.sum
}

// problem says what is wrong with a meta page, or "".
func (m meta) problem() string {
	switch {
	case m.magic != boltpage.Magic:
		return "not a bbolt meta page (no magic number)"
	case m.version != boltpage.Version:
		return fmt.Sprintf("bbolt format version %d, not %d", m.version, boltpage.Version)
	case m.checksum != m.sum:
		return "checksum mismatch"
	case m.pageSize < 1024 || m.pageSize > 1<<24 || m.pageSize&(m.pageSize-1) != 0:
		return fmt.Sprintf("page size %d is not a power of two between 1 KiB and 16 MiB", m.pageSize)
	case m.txid%2 != uint64(m.page):
		return fmt.Sprintf("transaction %d belongs on meta page %d", m.txid, m.txid%2)
	case m.pgid < 2 || m.root < 2 || m.root >= m.pgid:
		return fmt.Sprintf("root page %d outside the file's %d pages", m.root, m.pgid)
	case m.freelist != boltpage.NoFreelist && (m.freelist < 2 || m.freelist >= m.pgid):
		return fmt.Sprintf("freelist page %d outside the file's %d pages", m.freelist, m.pgid)
	}
	return ""
}

// fileReport is what checkFile found in a file it accepts.
type fileReport struct {
	// rolledBack describes a damaged meta page that was accepted with
	// Options.AllowMetaRollback; empty otherwise.
	rolledBack string
}

// checkFile proves f (size bytes) safe to hand to bbolt, or says why not:
// ErrNotAStore for what is not a bbolt file at all, ErrCorrupt for a damaged
// one.
func checkFile(f io.ReaderAt, data []byte, size int64, allowRollback bool) (fileReport, error) {
	var rep fileReport
	if size == 0 {
		return rep, notAStore("the file is empty")
	}
	head := make([]byte, boltpage.HeaderSize+boltpage.MetaSize)
	n, _ := f.ReadAt(head, 0)
	m0 := parseMeta(0, head[:n])
	pageSize := int64(m0.pageSize)
	if m0.problem() != "" {
		// Find the second meta page the way bbolt does: try each page size.
		pageSize = 0
		for sz := int64(1024); sz <= 1<<24 && sz < size; sz <<= 1 {
			n, _ := f.ReadAt(head, sz)
			if m := parseMeta(1, head[:n]); m.problem() == "" && int64(m.pageSize) == sz {
				pageSize = sz
				break
			}
		}
		if pageSize == 0 {
			if m0.magic != boltpage.Magic {
				return rep, notAStore("not a bbolt file (no valid meta page)")
			}
			return rep, corrupt("both bbolt meta pages are damaged (meta page 0: %s)", m0.problem())
		}
	}
	if size < 2*pageSize {
		return rep, corrupt("the file is truncated: %d bytes, shorter than its two meta pages", size)
	}
	metas := [2]meta{
		parseMeta(0, readUpTo(f, 0, boltpage.HeaderSize+boltpage.MetaSize)),
		parseMeta(1, readUpTo(f, pageSize, boltpage.HeaderSize+boltpage.MetaSize)),
	}
	newest := -1
	for i, m := range metas {
		if m.problem() == "" && int64(m.pageSize) == pageSize && (newest < 0 || m.txid > metas[newest].txid) {
			newest = i
		}
	}
	if newest < 0 {
		return rep, corrupt("both bbolt meta pages are damaged (meta page 0: %s; meta page 1: %s)",
			metas[0].problem(), metas[1].problem())
	}
	if other := metas[1-newest]; other.problem() != "" || int64(other.pageSize) != pageSize {
		why := other.problem()
		if why == "" {
			why = fmt.Sprintf("page size %d, the other's is %d", other.pageSize, pageSize)
		}
		msg := fmt.Sprintf("bbolt meta page %d is damaged (%s); the other holds transaction %d, and opening would silently drop "+
			"whatever the damaged page committed after it", other.page, why, metas[newest].txid)
		switch {
		case other.bboltValid() && other.txid > metas[newest].txid:
			// bbolt would use the damaged page, not the one checked here.
			return rep, corrupt("%s; bbolt itself would open the damaged page, so it cannot be rolled back", msg)
		case !allowRollback:
			return rep, corrupt("%s (Options.AllowMetaRollback accepts that, for recovery tooling)", msg)
		}
		rep.rolledBack = msg
	}
	m := metas[newest]
	if need := int64(m.pgid) * pageSize; m.pgid > uint64(size/pageSize) || size < need {
		return rep, corrupt("the file is truncated: %d bytes, its %d pages need %d", size, m.pgid, int64(m.pgid)*pageSize)
	}
	w := &walker{f: f, data: data, pageSize: pageSize, hwm: m.pgid, reached: make([]uint64, (m.pgid+63)/64)}
	w.mark(0, 1)
	var free []uint64
	if m.freelist != boltpage.NoFreelist {
		var err error
		if free, err = w.freelist(m.freelist); err != nil {
			return rep, err
		}
	}
	if _, err := w.tree(m.root, nil, nil, 0); err != nil {
		return rep, err
	}
	// bbolt hands a synced freelist's pages out for new writes: none may be
	// in use (the freelist page itself included) or listed twice.
	listed := map[uint64]bool{}
	for _, id := range free {
		switch {
		case w.reached[id/64]&(1<<(id%64)) != 0:
			return rep, corrupt("the bbolt freelist lists page %d, which is in use", id)
		case listed[id]:
			return rep, corrupt("the bbolt freelist lists page %d twice", id)
		}
		listed[id] = true
	}
	return rep, nil
}

// readUpTo returns up to n bytes of f from off, as many as it has.
func readUpTo(f io.ReaderAt, off int64, n int) []byte {
	buf := make([]byte, n)
	n, _ = f.ReadAt(buf, off)
	return buf[:n]
}

// walker follows a file's pages from the root.
type walker struct {
	f        io.ReaderAt
	pageSize int64
	hwm      uint64   // pages in use, from the newest meta
	reached  []uint64 // bitset of pages referenced so far

	// data is the file mapped read-only, where the platform allows;
	// otherwise it is read in chunks, a read each (bbolt lays pages out
	// close to their parents), the last few chunks kept.
	data   []byte
	chunks map[int64][]byte
	recent []int64
}

const (
	chunkSize  = 1 << 20
	keptChunks = 16
)

// chunk returns the chunkSize bytes of the file from off (aligned), or
// fewer at its end.
func (w *walker) chunk(off int64) ([]byte, error) {
	if c, ok := w.chunks[off]; ok {
		return c, nil
	}
	c := make([]byte, chunkSize)
	n, err := w.f.ReadAt(c, off)
	if n == 0 && err != nil {
		return nil, err
	}
	if w.chunks == nil {
		w.chunks = map[int64][]byte{}
	}
	if len(w.recent) == keptChunks {
		delete(w.chunks, w.recent[0])
		w.recent = w.recent[1:]
	}
	w.chunks[off], w.recent = c[:n], append(w.recent, off)
	return c[:n], nil
}

// read returns n bytes of the file from off: a slice of a chunk when they
// lie in one, a fresh buffer otherwise.
func (w *walker) read(off, n int64) ([]byte, error) {
	if w.data != nil {
		if off+n > int64(len(w.data)) {
			return nil, io.ErrUnexpectedEOF
		}
		return w.data[off : off+n : off+n], nil
	}
	base := off - off%chunkSize
	if off+n <= base+chunkSize {
		c, err := w.chunk(base)
		if err != nil {
			return nil, err
		}
		if off+n-base > int64(len(c)) {
			return nil, io.ErrUnexpectedEOF
		}
		return c[off-base : off+n-base : off+n-base], nil
	}
	buf := make([]byte, n)
	if _, err := w.f.ReadAt(buf, off); err != nil {
		return nil, err
	}
	return buf, nil
}

// fileError is what checkFile refuses a file with: its kind (ErrCorrupt,
// ErrNotAStore) and what exactly is wrong; Open adds the path.
type fileError struct {
	kind   error
	detail string
}

func (e *fileError) Error() string { return e.kind.Error() + ": " + e.detail }
func (e *fileError) Unwrap() error { return e.kind }

func corrupt(format string, a ...any) error {
	return &fileError{ErrCorrupt, fmt.Sprintf(format, a...)}
}

func notAStore(format string, a ...any) error {
	return &fileError{ErrNotAStore, fmt.Sprintf(format, a...)}
}

// mark records pages [id, id+n) as referenced, failing on a second reference.
func (w *walker) mark(id, n uint64) error {
	for p := id; p < id+n; p++ {
		if w.reached[p/64]&(1<<(p%64)) != 0 {
			return corrupt("bbolt page %d is referenced twice", p)
		}
		w.reached[p/64] |= 1 << (p % 64)
	}
	return nil
}

// page reads page id with its overflow pages, checking its header.
func (w *walker) page(id uint64) ([]byte, error) {
	if id < 2 || id >= w.hwm {
		return nil, corrupt("bbolt page %d is outside the file's %d pages", id, w.hwm)
	}
	head, err := w.read(int64(id)*w.pageSize, boltpage.HeaderSize)
	if err != nil {
		return nil, corrupt("bbolt page %d cannot be read: %v", id, err)
	}
	if got := order.Uint64(head[boltpage.PageID:]); got != id {
		return nil, corrupt("bbolt page %d says it is page %d", id, got)
	}
	overflow := uint64(order.Uint32(head[boltpage.PageOverflow:]))
	if overflow >= w.hwm-id {
		return nil, corrupt("bbolt page %d overflows past the file's %d pages (%d overflow pages)", id, w.hwm, overflow)
	}
	if err := w.mark(id, overflow+1); err != nil {
		return nil, err
	}
	buf, err := w.read(int64(id)*w.pageSize, int64(overflow+1)*w.pageSize)
	if err != nil {
		return nil, corrupt("bbolt page %d cannot be read: %v", id, err)
	}
	return buf, nil
}

// freelist reads a synced freelist page and returns the ids it lists,
// each a page of the file.
func (w *walker) freelist(id uint64) ([]uint64, error) {
	p, err := w.page(id)
	if err != nil {
		return nil, err
	}
	if flags := order.Uint16(p[boltpage.PageFlags:]); flags != boltpage.FlagFreelist {
		return nil, corrupt("bbolt freelist page %d has page flags %#x", id, flags)
	}
	start, count := uint64(boltpage.HeaderSize), uint64(order.Uint16(p[boltpage.PageCount:]))
	if count == boltpage.CountOverflow {
		if len(p) < boltpage.HeaderSize+8 {
			return nil, corrupt("bbolt freelist page %d is too short", id)
		}
		count, start = order.Uint64(p[boltpage.HeaderSize:]), boltpage.HeaderSize+8
	}
	if count > (uint64(len(p))-start)/8 {
		return nil, corrupt("bbolt freelist page %d lists %d pages, more than it holds", id, count)
	}
	ids := make([]uint64, count)
	for i := range count {
		if ids[i] = order.Uint64(p[start+8*i:]); ids[i] < 2 || ids[i] >= w.hwm {
			return nil, corrupt("bbolt freelist page %d lists page %d, outside the file's %d pages", id, ids[i], w.hwm)
		}
	}
	return ids, nil
}

// tree checks the subtree rooted at page id, whose keys must lie in
// [lo, hi) (nil: unbounded), and returns its largest key.
func (w *walker) tree(id uint64, lo, hi []byte, depth int) ([]byte, error) {
	if depth > maxNesting {
		return nil, corrupt("bbolt pages nest more than %d deep at page %d", maxNesting, id)
	}
	p, err := w.page(id)
	if err != nil {
		return nil, err
	}
	switch flags := order.Uint16(p[boltpage.PageFlags:]); flags {
	case boltpage.FlagBranch:
		return w.branch(id, p, lo, hi, depth)
	case boltpage.FlagLeaf:
		return w.leaf(where{page: id}, p, lo, hi, depth, false)
	default:
		return nil, corrupt("bbolt page %d has page flags %#x where a branch or leaf page belongs", id, flags)
	}
}

// where names the page an element lives on in error messages, built only
// when there is an error: a file page, or the inline page of a bucket.
type where struct {
	page   uint64
	branch bool
	bucket []byte // inline bucket's name (page is then its parent's page)
}

func (w where) String() string {
	kind := "leaf"
	if w.branch {
		kind = "branch"
	}
	if w.bucket != nil {
		return fmt.Sprintf("bucket %q (on bbolt page %d)", w.bucket, w.page)
	}
	return fmt.Sprintf("bbolt %s page %d", kind, w.page)
}

// elements returns the count of p's elements once they fit in p.
func elements(what where, p []byte) (int, error) {
	count := int(order.Uint16(p[boltpage.PageCount:]))
	if boltpage.HeaderSize+count*boltpage.ElemSize > len(p) {
		return 0, corrupt("%s claims %d elements, more than its %d bytes hold", what, count, len(p))
	}
	return count, nil
}

// span returns p[off+pos : off+pos+n], the bytes element i points at. They
// must lie after the data of the elements before it (next): bbolt lays a
// page's data out in element order, each byte used once, so overlapping
// elements are damage — and would let a small page stand for an
// exponentially large tree.
func span(what where, p []byte, i, off int, pos uint32, n uint64, next *uint64) ([]byte, error) {
	start := uint64(off) + uint64(pos)
	end := start + n
	switch {
	case end > uint64(len(p)):
		return nil, corrupt("%s has element %d reaching byte %d of %d", what, i, end, len(p))
	case start < *next:
		return nil, corrupt("%s: the data of element %d overlaps what comes before it", what, i)
	}
	*next = end
	return p[start:end], nil
}

// inOrder checks key against the previous key on its page (or the lower
// bound) and the upper bound.
func inOrder(what where, i int, key, prev, hi []byte, first bool) error {
	switch {
	case prev != nil && first && bytes.Compare(prev, key) > 0:
		return corrupt("%s: key %d sorts before its ancestor's", what, i)
	case prev != nil && !first && bytes.Compare(prev, key) >= 0:
		return corrupt("%s: key %d does not sort after key %d", what, i, i-1)
	case hi != nil && bytes.Compare(key, hi) >= 0:
		return corrupt("%s: key %d does not sort before the next key of its parent", what, i)
	}
	return nil
}

func (w *walker) branch(id uint64, p, lo, hi []byte, depth int) ([]byte, error) {
	what := where{page: id, branch: true}
	count, err := elements(what, p)
	if err != nil {
		return nil, err
	}
	if count == 0 {
		return nil, corrupt("%s has no elements", what)
	}
	keys := make([][]byte, count)
	children := make([]uint64, count)
	next := uint64(boltpage.HeaderSize + count*boltpage.ElemSize)
	for i := range count {
		off := boltpage.HeaderSize + i*boltpage.ElemSize
		pos, ksize := order.Uint32(p[off+boltpage.BranchPos:]), order.Uint32(p[off+boltpage.BranchKeySize:])
		if keys[i], err = span(what, p, i, off, pos, uint64(ksize), &next); err != nil {
			return nil, err
		}
		if len(keys[i]) == 0 {
			return nil, corrupt("%s has element %d with an empty key", what, i)
		}
		children[i] = order.Uint64(p[off+boltpage.BranchChild:])
	}
	// As bbolt's check does: each element's key lies after the largest
	// key of the subtree before it, and each subtree within its keys.
	prev := lo
	var max []byte
	for i := range count {
		if err := inOrder(what, i, keys[i], prev, hi, i == 0); err != nil {
			return nil, err
		}
		next := hi
		if i+1 < count {
			next = keys[i+1]
		}
		if max, err = w.tree(children[i], keys[i], next, depth+1); err != nil {
			return nil, err
		}
		prev = max
	}
	return max, nil
}

// leaf checks a leaf page (a file page, or an inline bucket's page) and
// the buckets its elements hold.
// inline says p is an inline bucket's page, which bbolt never gives
// buckets of its own.
func (w *walker) leaf(what where, p, lo, hi []byte, depth int, inline bool) ([]byte, error) {
	count, err := elements(what, p)
	if err != nil {
		return nil, err
	}
	prev := lo
	next := uint64(boltpage.HeaderSize + count*boltpage.ElemSize)
	for i := range count {
		off := boltpage.HeaderSize + i*boltpage.ElemSize
		flags, pos := order.Uint32(p[off+boltpage.LeafFlags:]), order.Uint32(p[off+boltpage.LeafPos:])
		ksize, vsize := order.Uint32(p[off+boltpage.LeafKeySize:]), order.Uint32(p[off+boltpage.LeafValueSize:])
		kv, err := span(what, p, i, off, pos, uint64(ksize)+uint64(vsize), &next)
		if err != nil {
			return nil, err
		}
		key, val := kv[:ksize], kv[ksize:]
		if len(key) == 0 {
			return nil, corrupt("%s has element %d with an empty key", what, i)
		}
		if err := inOrder(what, i, key, prev, hi, i == 0); err != nil {
			return nil, err
		}
		prev = key
		switch flags {
		case 0:
		case boltpage.FlagBucket:
			if inline {
				return nil, corrupt("%s holds a bucket, %q, inside an inline bucket", what, key)
			}
			if err := w.bucket(where{page: what.page, bucket: key}, val, depth+1); err != nil {
				return nil, err
			}
		default:
			return nil, corrupt("%s has element %d with flags %#x", what, i, flags)
		}
	}
	if count == 0 {
		return nil, nil
	}
	return prev, nil
}

// bucket checks a bucket header and the tree or inline page it names.
func (w *walker) bucket(what where, val []byte, depth int) error {
	if len(val) < boltpage.BucketHeaderSize {
		return corrupt("%s: the bucket header is %d bytes", what, len(val))
	}
	if root := order.Uint64(val); root != 0 { // the bucket header's root page
		_, err := w.tree(root, nil, nil, depth)
		return err
	}
	inline := val[boltpage.BucketHeaderSize:]
	if len(inline) < boltpage.HeaderSize {
		return corrupt("%s: the inline bucket is %d bytes", what, len(inline))
	}
	if flags := order.Uint16(inline[boltpage.PageFlags:]); flags != boltpage.FlagLeaf {
		return corrupt("%s: the inline bucket has page flags %#x", what, flags)
	}
	// bbolt writes an inline page with id and overflow 0, and frees the
	// page an inline bucket's id names once the bucket outgrows its page:
	// any other id would free a page in use.
	if id, overflow := order.Uint64(inline[boltpage.PageID:]), order.Uint32(inline[boltpage.PageOverflow:]); id != 0 || overflow != 0 {
		return corrupt("%s: the inline bucket's page claims id %d and %d overflow pages, not 0", what, id, overflow)
	}
	if depth > maxNesting {
		return corrupt("%s: buckets nest more than %d deep", what, maxNesting)
	}
	_, err := w.leaf(what, inline, nil, nil, depth, true)
	return err
}

// fileSize is f's size, or an error naming what f is when it is not a
// regular file.
func fileSize(f *os.File) (int64, error) {
	fi, err := f.Stat()
	if err != nil {
		return 0, err
	}
	if !fi.Mode().IsRegular() {
		return 0, notAStore("not a regular file (%s)", fi.Mode().Type())
	}
	return fi.Size(), nil
}
