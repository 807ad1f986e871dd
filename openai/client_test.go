package openai_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/polyloop/polyloop/events"
	"github.com/polyloop/polyloop/openai"
	"github.com/polyloop/polyloop/seams"
)

var call = seams.ModelCall{Messages: []seams.Message{
	seams.Text(seams.RoleSystem, "You are terse."),
	{Role: seams.RoleUser, Content: []seams.ContentBlock{seams.TextBlock{Text: "2+2"}, seams.TextBlock{Text: "?"}}},
	seams.Text(seams.RoleAssistant, "ACTION: calc"),
}}

// server checks the request it receives and answers with a recorded body.
func server(t *testing.T, status int, body string, delay time.Duration) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != "/v1/chat/completions" {
			t.Errorf("request %s %s", r.Method, r.URL.Path)
		}
		if got := r.Header.Get("Authorization"); got != "Bearer sk-test" {
			t.Errorf("authorization %q", got)
		}
		var req struct {
			Model       string  `json:"model"`
			Temperature float64 `json:"temperature"`
			Messages    []struct{ Role, Content string }
		}
		b, _ := io.ReadAll(r.Body)
		if err := json.Unmarshal(b, &req); err != nil {
			t.Errorf("body: %v", err)
		}
		if req.Model != "qwen3" || req.Temperature != 0.2 || len(req.Messages) != 3 ||
			req.Messages[1].Role != "user" || req.Messages[1].Content != "2+2?" || req.Messages[2].Role != "assistant" {
			t.Errorf("request body %s", b)
		}
		select {
		case <-time.After(delay):
		case <-r.Context().Done():
			return
		}
		w.WriteHeader(status)
		io.WriteString(w, body)
	}))
	t.Cleanup(srv.Close)
	return srv
}

func client(t *testing.T, base string, max int64) *openai.Client {
	t.Helper()
	temp := 0.2
	c, err := openai.New(openai.Options{BaseURL: base + "/v1/", Model: "qwen3", APIKeyEnv: "POLYLOOP_TEST_KEY", Temperature: &temp, MaxResponseBytes: max})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestReplyContentThinkingAndID(t *testing.T) {
	t.Setenv("POLYLOOP_TEST_KEY", "sk-test")
	cases := map[string]struct {
		body, content, thinking string
	}{
		"plain":             {`{"id":"chatcmpl-1","choices":[{"message":{"role":"assistant","content":"4"}}]}`, "4", ""},
		"reasoning_content": {`{"id":"chatcmpl-1","choices":[{"message":{"content":"4","reasoning_content":"add them"}}]}`, "4", "add them"},
		"reasoning":         {`{"id":"chatcmpl-1","choices":[{"message":{"content":"4","reasoning":"sum"}}]}`, "4", "sum"},
		"null content":      {`{"id":"chatcmpl-1","choices":[{"message":{"content":null}}]}`, "", ""},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			srv := server(t, 200, c.body, 0)
			reply, err := client(t, srv.URL, 0).Call(context.Background(), call)
			if err != nil {
				t.Fatal(err)
			}
			if reply.Content != c.content || reply.Thinking != c.thinking || reply.CallID != "chatcmpl-1" {
				t.Fatalf("%+v", reply)
			}
		})
	}
}

func TestFailuresCarryStatusAndServerMessage(t *testing.T) {
	t.Setenv("POLYLOOP_TEST_KEY", "sk-test")
	cases := []struct {
		name   string
		status int
		body   string
		want   string
	}{
		{"api error json", 401, `{"error":{"message":"Incorrect API key provided","type":"invalid_request_error"}}`, "401 Unauthorized: Incorrect API key provided"},
		{"gateway text", 502, "upstream connect error", "502 Bad Gateway: upstream connect error"},
		{"rate limited", 429, `{"error":{"message":"Rate limit reached"}}`, "429 Too Many Requests: Rate limit reached"},
		{"not json", 200, "<html>", "not JSON"},
		{"no choices", 200, `{"id":"x","choices":[]}`, "no choices"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			srv := server(t, c.status, c.body, 0)
			_, err := client(t, srv.URL, 0).Call(context.Background(), call)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want %q", err, c.want)
			}
			var api *openai.APIError
			if c.status != 200 && (!errors.As(err, &api) || api.StatusCode != c.status) {
				t.Fatalf("not an *APIError with status %d: %v", c.status, err)
			}
		})
	}
}

func TestSlowResponseHonoursTheContext(t *testing.T) {
	t.Setenv("POLYLOOP_TEST_KEY", "sk-test")
	srv := server(t, 200, `{"id":"x","choices":[{"message":{"content":"late"}}]}`, 5*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := client(t, srv.URL, 0).Call(ctx, call)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v", err)
	}
	if time.Since(start) > 3*time.Second {
		t.Fatal("the call did not stop with its context")
	}
}

func TestResponseSizeIsBounded(t *testing.T) {
	t.Setenv("POLYLOOP_TEST_KEY", "sk-test")
	big := `{"id":"x","choices":[{"message":{"content":"` + strings.Repeat("a", 5000) + `"}}]}`
	srv := server(t, 200, big, 0)
	if _, err := client(t, srv.URL, 1000).Call(context.Background(), call); err == nil || !strings.Contains(err.Error(), "larger than 1000 bytes") {
		t.Fatalf("got %v", err)
	}
}

func TestKeyNeverInParameters(t *testing.T) {
	c, err := openai.New(openai.Options{BaseURL: "https://user:secret@api.example.com/v1", Model: "m", APIKey: "sk-secret"})
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range c.Parameters() {
		if strings.Contains(v, "secret") {
			t.Errorf("parameter %s leaks a credential: %s", k, v)
		}
	}
	if c.Parameters()["base_url"] != "https://api.example.com/v1" || c.Parameters()["model"] != "m" {
		t.Errorf("%v", c.Parameters())
	}
}

func TestNewRefusesBadOptions(t *testing.T) {
	for _, o := range []openai.Options{{Model: "m"}, {BaseURL: "ftp://x", Model: "m"}, {BaseURL: "http://localhost:8000/v1"}} {
		if _, err := openai.New(o); err == nil {
			t.Errorf("accepted %+v", o)
		}
	}
}

// TestUsageIsReadFromTheResponse: usage's four counts map to the reply's,
// each absent when the server leaves it out (absent is not zero).
func TestUsageIsReadFromTheResponse(t *testing.T) {
	t.Setenv("POLYLOOP_TEST_KEY", "sk-test")
	n := func(v int64) *int64 { return &v }
	cases := map[string]struct {
		usage string
		want  *events.Usage
	}{
		"none":  {``, nil},
		"basic": {`,"usage":{"prompt_tokens":12,"completion_tokens":3,"total_tokens":15}`, &events.Usage{InputTokens: n(12), OutputTokens: n(3)}},
		"details": {`,"usage":{"prompt_tokens":1200,"completion_tokens":300,"prompt_tokens_details":{"cached_tokens":1024},"completion_tokens_details":{"reasoning_tokens":250}}`,
			&events.Usage{InputTokens: n(1200), OutputTokens: n(300), CachedInputTokens: n(1024), ReasoningTokens: n(250)}},
		"zero is reported":    {`,"usage":{"prompt_tokens":0,"completion_tokens":0}`, &events.Usage{InputTokens: n(0), OutputTokens: n(0)}},
		"empty object":        {`,"usage":{}`, nil},
		"negative":            {`,"usage":{"prompt_tokens":-1}`, nil},
		"a whole float":       {`,"usage":{"prompt_tokens":12.0,"completion_tokens":3}`, &events.Usage{InputTokens: n(12), OutputTokens: n(3)}},
		"not a number":        {`,"usage":{"prompt_tokens":"12","completion_tokens":3}`, nil},
		"a fraction":          {`,"usage":{"prompt_tokens":1.5,"completion_tokens":3}`, &events.Usage{OutputTokens: n(3)}},
		"usage not an object": {`,"usage":[1,2]`, nil},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			srv := server(t, 200, `{"id":"chatcmpl-1","choices":[{"message":{"content":"4"}}]`+c.usage+`}`, 0)
			reply, err := client(t, srv.URL, 0).Call(context.Background(), call)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(reply.Usage, c.want) {
				t.Fatalf("usage %+v, want %+v", reply.Usage, c.want)
			}
		})
	}
}
