package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/seams"
)

// documents is the corpus under review.
var documents = map[string]string{
	"lease-2024":  "Clause 1: rent is due monthly. Clause 2: the tenant may not sublet. Clause 3: either party may terminate without notice.",
	"nda-acme":    "Clause 1: confidential information stays confidential for 2 years. Clause 2: no liability cap applies.",
	"supply-beta": "Clause 1: delivery within 30 days. Clause 2: standard liability cap of 1x fees.",
}

// results is the consumer's database: findings and phase summaries, kept
// in a JSON file so another process (the next phase, a resumed run, a
// dashboard) reads them back. Safe for concurrent use.
type results struct {
	mu   sync.Mutex
	path string
}

type resultData struct {
	Findings  []finding         `json:"findings"`
	Summaries map[string]string `json:"summaries"` // by phase run id
}

type finding struct {
	RunID    string `json:"run_id"`    // the phase's run: each review reports its own findings
	ResultID string `json:"result_id"` // the engine's id for the tool call: an idempotency key
	Document string `json:"document"`
	Clause   int    `json:"clause"`
	Severity string `json:"severity"`
	Note     string `json:"note"`
}

func (r *results) load() (resultData, error) {
	var d resultData
	b, err := os.ReadFile(r.path)
	if errors.Is(err, os.ErrNotExist) {
		return resultData{Summaries: map[string]string{}}, nil
	}
	if err != nil {
		return d, err
	}
	if err := json.Unmarshal(b, &d); err != nil {
		return d, fmt.Errorf("results %s: %w", r.path, err)
	}
	if d.Summaries == nil {
		d.Summaries = map[string]string{}
	}
	return d, nil
}

// update applies f and writes the file atomically (temp file, sync, rename).
func (r *results) update(f func(*resultData)) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	d, err := r.load()
	if err != nil {
		return err
	}
	f(&d)
	b, err := json.MarshalIndent(d, "", "  ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(r.path), ".results-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), r.path)
}

// The tools. Reads are safe to repeat after a crash; writing a finding and
// submitting are not (never).
func tools(db *results) (*seams.Registry, error) {
	docArg := map[string]any{"type": "object", "required": []string{"id"}, "additionalProperties": false,
		"properties": map[string]any{"id": map[string]any{"type": "string", "enum": docIDs()}}}
	return seams.NewRegistry(
		seams.Tool{
			Spec: seams.ToolSpec{Name: "list_documents", Description: "List the documents to review.", ReplayPolicy: events.ReplaySafe,
				Parameters: map[string]any{"type": "object", "additionalProperties": false}},
			Handler: func(context.Context, map[string]any) (string, error) { return strings.Join(docIDs(), "\n"), nil },
		},
		seams.Tool{
			Spec:    seams.ToolSpec{Name: "read_document", Description: "Read a document.", ReplayPolicy: events.ReplaySafe, Parameters: docArg},
			Handler: func(_ context.Context, a map[string]any) (string, error) { return documents[a["id"].(string)], nil },
		},
		seams.Tool{
			Spec: seams.ToolSpec{Name: "flag_issue", Description: "Record a problem in a clause.",
				Parameters: map[string]any{"type": "object", "required": []string{"document", "clause", "severity", "note"},
					"additionalProperties": false, "properties": map[string]any{
						"document": map[string]any{"type": "string", "enum": docIDs()},
						"clause":   map[string]any{"type": "integer", "minimum": 1},
						"severity": map[string]any{"enum": []string{"low", "high"}},
						"note":     map[string]any{"type": "string", "minLength": 3}}}},
			Handler: func(ctx context.Context, a map[string]any) (string, error) {
				call, _ := seams.CallOf(ctx)
				clause, _ := a["clause"].(float64)
				f := finding{RunID: call.RunID, ResultID: call.ResultID, Document: a["document"].(string), Clause: int(clause),
					Severity: a["severity"].(string), Note: a["note"].(string)}
				if err := db.update(func(d *resultData) { d.Findings = append(d.Findings, f) }); err != nil {
					return "", seams.EnvFailure(err) // the database is down: not the model's problem
				}
				return fmt.Sprintf("recorded %s clause %d (%s)", f.Document, f.Clause, f.Severity), nil
			},
		},
		seams.Tool{
			Spec: seams.ToolSpec{Name: "submit", Description: "Submit this phase's summary.", CompletesRun: true,
				Parameters: map[string]any{"type": "object", "required": []string{"summary"},
					"properties": map[string]any{"summary": map[string]any{"type": "string"}}}},
			Handler: func(ctx context.Context, a map[string]any) (string, error) {
				call, _ := seams.CallOf(ctx)
				summary := a["summary"].(string)
				if err := db.update(func(d *resultData) { d.Summaries[call.RunID] = summary }); err != nil {
					return "", seams.EnvFailure(err)
				}
				return "submitted", nil
			},
		},
	)
}

func docIDs() []string {
	var ids []string
	for id := range documents {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}
