package seamstest_test

import (
	"testing"

	"github.com/polyloop/polyloop/proptest"
	"github.com/polyloop/polyloop/seams"
	"github.com/polyloop/polyloop/seams/seamstest"
)

func TestMemStoreKeepsTheRunStoreContract(t *testing.T) {
	proptest.RunStoreContract(t, func(*testing.T) seams.RunStore { return new(seamstest.MemStore) })
}

func TestMemStoreKeepsTheRunDeleterContract(t *testing.T) {
	proptest.RunDeleterContract(t, func(*testing.T) proptest.DeletingStore { return new(seamstest.MemStore) })
}
