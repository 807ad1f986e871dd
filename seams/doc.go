// Package seams holds the interfaces through which a consumer plugs into
// PolyLoop and the shapes passed through them. This file set grows with the
// engine; today it holds the RunStore contract and its append rules.
//
// What does not live here: implementations (kv.Store is the bbolt store;
// seams/seamstest holds test doubles) and the loop itself (package engine).
package seams
