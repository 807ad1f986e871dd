package openai_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"

	"github.com/polyloop/polyloop/openai"
	"github.com/polyloop/polyloop/seams"
)

// A client of a chat-completions endpoint — here a stand-in server that
// answers as OpenAI's API does — called with a run's messages. The server
// prints what it was sent; the reply carries the content, the provider's
// call id and the token usage.
func ExampleNew() {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Model    string `json:"model"`
			Messages []struct {
				Role    string `json:"role"`
				Content string `json:"content"`
			} `json:"messages"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		fmt.Printf("server: POST %s, model %s, %d messages, the last %s: %q\n",
			r.URL.Path, req.Model, len(req.Messages), req.Messages[len(req.Messages)-1].Role, req.Messages[len(req.Messages)-1].Content)
		fmt.Fprint(w, `{"id": "chatcmpl-7", "choices": [{"message": {"role": "assistant", "content": "FINAL: 4"}}],
			"usage": {"prompt_tokens": 21, "completion_tokens": 3}}`)
	}))
	defer srv.Close()

	client, err := openai.New(openai.Options{BaseURL: srv.URL + "/v1", Model: "qwen2.5", APIKey: "sk-example"})
	if err != nil {
		log.Fatal(err)
	}
	reply, err := client.Call(context.Background(), seams.ModelCall{Messages: []seams.Message{
		seams.Text(seams.RoleSystem, "Answer with FINAL: <answer>."),
		seams.Text(seams.RoleUser, "What is 2 + 2?"),
	}})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("reply %q, call id %s, %d tokens in, %d out\n", reply.Content, reply.CallID, *reply.Usage.InputTokens, *reply.Usage.OutputTokens)
	params := client.Parameters() // in the run's parameter snapshot; never the key
	fmt.Println(params["kind"], params["model"])
	// Output:
	// server: POST /v1/chat/completions, model qwen2.5, 2 messages, the last user: "What is 2 + 2?"
	// reply "FINAL: 4", call id chatcmpl-7, 21 tokens in, 3 out
	// openai-chat-completions qwen2.5
}
