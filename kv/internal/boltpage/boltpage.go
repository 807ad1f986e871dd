// Package boltpage is bbolt's on-disk format version 2 as bbolt writes it,
// in the machine's byte order: the page header, the meta page, branch and
// leaf elements, bucket headers and the freelist page, as offsets, sizes,
// flags and magic numbers. It is the one place kv knows them: kv's file
// check (kv/file.go) reads files by them, and package kvtest damages files
// by them. bbolt keeps the same facts in its internal/common.
//
// What does not live here: what a sound file is (kv's file check) and the
// layout kv keeps inside bbolt's buckets (kv/layout.go).
package boltpage

import "encoding/binary"

// Order is the byte order of every number in the file: the machine's.
var Order = binary.NativeEndian

// The page header, at the start of every page: id u64, flags u16, element
// count u16, overflow pages u32. A freelist page whose count is 0xFFFF
// holds its real count in the u64 after the header.
const (
	HeaderSize = 16

	PageID       = 0  // u64: the page's own id
	PageFlags    = 8  // u16: FlagBranch, FlagLeaf, FlagFreelist (meta pages: 0x04)
	PageCount    = 10 // u16: elements (freelist: ids) on the page
	PageOverflow = 12 // u32: pages after this one that it spans

	// CountOverflow in PageCount means the freelist's count is the u64
	// after the header.
	CountOverflow = 0xFFFF
)

// Page flags.
const (
	FlagBranch   = 0x01
	FlagLeaf     = 0x02
	FlagFreelist = 0x10
)

// The meta page: two of them, pages 0 and 1, each a header then these
// fields; offsets are from the end of the header.
const (
	MetaSize = 64

	MetaMagic    = 0  // u32: Magic
	MetaVersion  = 4  // u32: Version
	MetaPageSize = 8  // u32: the file's page size
	MetaFlags    = 12 // u32
	MetaRoot     = 16 // u64: the root bucket's page (its bucket header's root)
	MetaSequence = 24 // u64: the root bucket's sequence
	MetaFreelist = 32 // u64: the freelist page, or NoFreelist
	MetaPgid     = 40 // u64: the high-water mark, pages in use
	MetaTxid     = 48 // u64: the transaction that wrote this meta page
	MetaChecksum = 56 // u64: FNV-1a (64-bit) of the meta's bytes before it

	Magic   = 0xED0CDAED
	Version = 2

	// NoFreelist in MetaFreelist: the freelist is not written (bbolt's
	// NoFreelistSync); bbolt rebuilds it at open by walking the pages.
	NoFreelist = ^uint64(0)
)

// Elements follow the page header, ElemSize bytes each; the element at
// offset off points at its data at off+pos. Branch elements: pos u32, key
// size u32, child page u64. Leaf elements: flags u32, pos u32, key size
// u32, value size u32.
const (
	ElemSize = 16

	BranchPos     = 0
	BranchKeySize = 4
	BranchChild   = 8

	LeafFlags     = 0
	LeafPos       = 4
	LeafKeySize   = 8
	LeafValueSize = 12

	// FlagBucket in LeafFlags: the value is a bucket header.
	FlagBucket = 0x01
)

// A bucket header: its root page u64 (0: the bucket is inline, a leaf page
// following the header in the value) and its sequence u64.
const BucketHeaderSize = 16
