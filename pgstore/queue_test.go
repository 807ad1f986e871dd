package pgstore_test

import (
	"context"
	"errors"
	"testing"

	"github.com/oklog/ulid/v2"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/pgstore"
	"github.com/polyloop/polyloop/seams"
)

// TestAnAgentRefusedByTheRuleIsNotStarted: a RunStarted naming an agent
// ValidAgent refuses is refused by the append, writing nothing.
func TestAnAgentRefusedByTheRuleIsNotStarted(t *testing.T) {
	ctx := context.Background()
	s := open(t, pgstore.Options{})
	started := events.RunStarted{RunID: "r", SchemaVersion: events.CurrentSchemaVersion, Agent: "bad\x00agent"}
	if _, err := s.Append(ctx, "r", ulid.ULID{}, started); !errors.Is(err, seams.ErrInvalidAgent) {
		t.Fatalf("start for an agent holding NUL: %v, want ErrInvalidAgent", err)
	}
	if got, err := s.Load(ctx, "r"); err != nil || len(got) != 0 {
		t.Fatalf("the refused start left %d events, %v", len(got), err)
	}
}
