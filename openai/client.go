// Package openai is a seams.ModelClient for OpenAI-compatible
// chat-completions endpoints: the API served by OpenAI, vLLM, Ollama,
// llama.cpp and most gateways. It uses only the standard library's HTTP
// client.
//
// A call posts the run's messages (roles mapped one to one, text blocks
// joined) to {BaseURL}/chat/completions and returns the first choice's
// content, the reasoning text when the server sends one (reasoning_content
// or reasoning), and the response id as the call id. HTTP and API failures
// are errors carrying the status and the server's message; responses are
// read up to a bound. The API key comes from an option or, by default, the
// OPENAI_API_KEY environment variable; it is sent as a bearer token and
// never logged nor reported in Parameters.
//
// What does not live here: tool calling in the provider's native format.
// PolyLoop's tools travel as text the DecisionParser reads, so any
// chat-completions server works.
package openai

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/seams"
)

// DefaultMaxResponseBytes bounds a response body.
const DefaultMaxResponseBytes = 8 << 20

// Options configure a Client.
type Options struct {
	// BaseURL is the API root, e.g. https://api.openai.com/v1 or
	// http://localhost:11434/v1. Required.
	BaseURL string
	// Model is the model name sent with every request. Required.
	Model string
	// APIKey is the bearer token; empty means the environment variable
	// named by APIKeyEnv. A server that needs none (a local one) is fine.
	APIKey string
	// APIKeyEnv names the environment variable holding the key; empty
	// means OPENAI_API_KEY.
	APIKeyEnv string
	// Temperature, when set, is sent with every request.
	Temperature *float64
	// MaxTokens, when positive, is sent as max_tokens.
	MaxTokens int
	// HTTPClient, when set, replaces http.DefaultClient.
	HTTPClient *http.Client
	// MaxResponseBytes bounds a response body; zero means
	// DefaultMaxResponseBytes.
	MaxResponseBytes int64
}

// Client calls one model on one endpoint. Safe for concurrent use.
type Client struct {
	endpoint string
	base     string // BaseURL without credentials, for Parameters
	o        Options
	key      string
}

var _ seams.ModelClient = (*Client)(nil)

// New checks the options and returns a client.
func New(o Options) (*Client, error) {
	if o.Model == "" {
		return nil, errors.New("openai: Options.Model is empty")
	}
	u, err := url.Parse(strings.TrimRight(o.BaseURL, "/"))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("openai: Options.BaseURL %q is not an http(s) URL", o.BaseURL)
	}
	key := o.APIKey
	if key == "" {
		env := o.APIKeyEnv
		if env == "" {
			env = "OPENAI_API_KEY"
		}
		key = os.Getenv(env)
	}
	if o.MaxResponseBytes <= 0 {
		o.MaxResponseBytes = DefaultMaxResponseBytes
	}
	if o.HTTPClient == nil {
		o.HTTPClient = http.DefaultClient
	}
	endpoint := u.String() + "/chat/completions"
	u.User = nil
	return &Client{endpoint: endpoint, base: u.String(), o: o, key: key}, nil
}

// Parameters implements seams.ModelClient: model, endpoint and sampling
// settings. Never the key.
func (c *Client) Parameters() map[string]string {
	p := map[string]string{"kind": "openai-chat-completions", "model": c.o.Model, "base_url": c.base}
	if c.o.Temperature != nil {
		p["temperature"] = strconv.FormatFloat(*c.o.Temperature, 'g', -1, 64)
	}
	if c.o.MaxTokens > 0 {
		p["max_tokens"] = strconv.Itoa(c.o.MaxTokens)
	}
	return p
}

type wireMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

type wireRequest struct {
	Model       string        `json:"model"`
	Messages    []wireMessage `json:"messages"`
	Temperature *float64      `json:"temperature,omitempty"`
	MaxTokens   int           `json:"max_tokens,omitempty"`
}

type wireResponse struct {
	ID      string `json:"id"`
	Choices []struct {
		Message struct {
			Content          *string `json:"content"`
			ReasoningContent string  `json:"reasoning_content"`
			Reasoning        string  `json:"reasoning"`
		} `json:"message"`
	} `json:"choices"`
	Usage json.RawMessage `json:"usage"` // decoded leniently: a bad usage never fails the call
	Error *wireError      `json:"error"`
}

// wireUsage is the response's usage. Counts are read as JSON numbers of
// any form (some servers send 12.0); a count the server leaves out, or one
// that is not a whole non-negative number, stays nil (absent, not zero).
type wireUsage struct {
	PromptTokens        *float64 `json:"prompt_tokens"`
	CompletionTokens    *float64 `json:"completion_tokens"`
	PromptTokensDetails *struct {
		CachedTokens *float64 `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
	CompletionTokensDetails *struct {
		ReasoningTokens *float64 `json:"reasoning_tokens"`
	} `json:"completion_tokens_details"`
}

// usage is the reply's usage from the response's raw usage field, nil when
// it reports none or does not decode: usage is metadata, and a malformed
// one must not fail a call that did return a reply.
func usage(raw json.RawMessage) *events.Usage {
	var w wireUsage
	if len(raw) == 0 || json.Unmarshal(raw, &w) != nil {
		return nil
	}
	u := &events.Usage{InputTokens: count(w.PromptTokens), OutputTokens: count(w.CompletionTokens)}
	if d := w.PromptTokensDetails; d != nil {
		u.CachedInputTokens = count(d.CachedTokens)
	}
	if d := w.CompletionTokensDetails; d != nil {
		u.ReasoningTokens = count(d.ReasoningTokens)
	}
	if *u == (events.Usage{}) {
		return nil
	}
	return u
}

// count is a whole, non-negative token count, or nil.
func count(f *float64) *int64 {
	if f == nil || *f < 0 || *f != math.Trunc(*f) || *f > 1<<53 {
		return nil
	}
	n := int64(*f)
	return &n
}

type wireError struct {
	Message string `json:"message"`
	Type    string `json:"type"`
	Code    any    `json:"code"`
}

// APIError is a failure the server reported.
type APIError struct {
	StatusCode int    // HTTP status
	Message    string // the server's message
}

func (e *APIError) Error() string {
	return fmt.Sprintf("openai: %d %s: %s", e.StatusCode, http.StatusText(e.StatusCode), e.Message)
}

// Call implements seams.ModelClient.
func (c *Client) Call(ctx context.Context, call seams.ModelCall) (events.ModelReply, error) {
	req := wireRequest{Model: c.o.Model, Temperature: c.o.Temperature, MaxTokens: c.o.MaxTokens}
	for _, m := range call.Messages {
		req.Messages = append(req.Messages, wireMessage{Role: string(m.Role), Content: m.Text()})
	}
	body, err := json.Marshal(req)
	if err != nil {
		return events.ModelReply{}, fmt.Errorf("openai: encode request: %w", err)
	}
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, c.endpoint, bytes.NewReader(body))
	if err != nil {
		return events.ModelReply{}, fmt.Errorf("openai: %w", err)
	}
	hreq.Header.Set("Content-Type", "application/json")
	if c.key != "" {
		hreq.Header.Set("Authorization", "Bearer "+c.key)
	}
	resp, err := c.o.HTTPClient.Do(hreq)
	if err != nil {
		return events.ModelReply{}, fmt.Errorf("openai: %w", err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, c.o.MaxResponseBytes+1))
	if err != nil {
		return events.ModelReply{}, fmt.Errorf("openai: read response: %w", err)
	}
	if int64(len(raw)) > c.o.MaxResponseBytes {
		return events.ModelReply{}, fmt.Errorf("openai: response larger than %d bytes", c.o.MaxResponseBytes)
	}
	var wr wireResponse
	jsonErr := json.Unmarshal(raw, &wr)
	if resp.StatusCode/100 != 2 {
		msg := strings.TrimSpace(string(raw))
		if jsonErr == nil && wr.Error != nil && wr.Error.Message != "" {
			msg = wr.Error.Message
		}
		if len(msg) > 500 {
			msg = msg[:500] + "…"
		}
		return events.ModelReply{}, &APIError{StatusCode: resp.StatusCode, Message: msg}
	}
	switch {
	case jsonErr != nil:
		return events.ModelReply{}, fmt.Errorf("openai: response is not JSON: %w", jsonErr)
	case wr.Error != nil:
		return events.ModelReply{}, &APIError{StatusCode: resp.StatusCode, Message: wr.Error.Message}
	case len(wr.Choices) == 0:
		return events.ModelReply{}, errors.New("openai: response has no choices")
	}
	m := wr.Choices[0].Message
	reply := events.ModelReply{CallID: wr.ID, Thinking: m.ReasoningContent, Usage: usage(wr.Usage)}
	if reply.Thinking == "" {
		reply.Thinking = m.Reasoning
	}
	if m.Content != nil {
		reply.Content = *m.Content
	}
	return reply, nil
}
