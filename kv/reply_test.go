package kv

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/oklog/ulid/v2"
	bolt "go.etcd.io/bbolt"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/proptest"
)

// TestAStepAfterALostReplyIsNotReadWithAnEarlierOne: a step stores its raw
// output as a reference to the run's latest reply. When that reply is lost
// from the log, Load reaches the step by walking back from the tail and the
// earlier reply by walking forward from the first event; the step must come
// back as damage, never decoded with the earlier reply's text.
func TestAStepAfterALostReplyIsNotReadWithAnEarlierOne(t *testing.T) {
	ctx := context.Background()
	stream := proptest.SoundStream("r")
	replyA, replyB, step := referringStep(stream)
	s, keys := appendEach(t, stream[0], stream[1], replyA, stream[3], step(replyA.Reply.Content), stream[5], replyB, step(replyB.Reply.Content))
	lost := keys[6] // reply B
	if err := s.db.Update(func(tx *bolt.Tx) error { return tx.Bucket(logBucket).Delete(lost[:]) }); err != nil {
		t.Fatal(err)
	}
	got, err := s.Load(ctx, "r")
	if !errors.Is(err, ErrCorrupt) {
		t.Fatalf("load after losing a reply: %v", err)
	}
	for _, env := range got {
		if sc, ok := env.Event.(events.StepCompleted); ok && env.ID == keys[7] {
			t.Fatalf("the step after the lost reply was read with raw output %.20q…", sc.Step.RawOutput)
		}
	}
	if len(got) != 6 {
		t.Fatalf("%d events came back beside the damage, want the 6 before the lost reply", len(got))
	}
}

// TestAPointerReplyIsTheLatestReply: a model result appended as a pointer
// is the run's latest reply like a value one, so a step repeating the
// earlier reply stores it rather than referring to the later one.
func TestAPointerReplyIsTheLatestReply(t *testing.T) {
	stream := proptest.SoundStream("r")
	first, second, step := referringStep(stream)
	a := first.Reply.Content
	s, _ := appendEach(t, stream[0], stream[1], first, &second, step(a))
	got, err := s.Load(context.Background(), "r")
	if err != nil {
		t.Fatal(err)
	}
	if raw := got[len(got)-1].Event.(events.StepCompleted).Step.RawOutput; raw != a {
		t.Fatalf("the step's raw output reads back as %.20q…, written %.20q…", raw, a)
	}
}

// referringStep is two model results of stream's first step with replies
// long enough to be referred to (A, then B), and the step completing it
// with a given raw output and an observation large enough, once
// compressed, that the step is stored compressed — so the step refers to
// the latest reply when its raw output is that reply.
func referringStep(stream []events.Event) (a, b events.ModelCallResult, step func(raw string) events.StepCompleted) {
	a = stream[2].(events.ModelCallResult)
	a.Reply = &events.ModelReply{Content: strings.Repeat("reply A, long enough to be worth a reference. ", 30)}
	b = a
	b.Reply = &events.ModelReply{Content: strings.Repeat("reply B, long enough to be worth a reference. ", 30)}
	var obs strings.Builder
	for i := range 200 {
		fmt.Fprintf(&obs, "f%x.go %d\n", i*7919%4093, i*104729%65521)
	}
	return a, b, func(raw string) events.StepCompleted {
		sc := stream[4].(events.StepCompleted)
		out := *sc.ActionOutcome
		out.Observation = obs.String()
		sc.ActionOutcome, sc.Step.Observation = &out, obs.String()
		sc.Step.RawOutput, sc.Step.Action = raw, nil
		return sc
	}
}

// appendEach opens a store and appends evs to run "r" one Append each
// (proptest.AppendEach), returning the store and the events' keys.
func appendEach(t *testing.T, evs ...events.Event) (*Store, []ulid.ULID) {
	s, err := Open(filepath.Join(t.TempDir(), "s.db"), Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	proptest.AppendEach(t, s, "r", evs)
	stream, err := s.Load(context.Background(), "r")
	if err != nil {
		t.Fatal(err)
	}
	keys := make([]ulid.ULID, len(stream))
	for i, env := range stream {
		keys[i] = env.ID
	}
	return s, keys
}
