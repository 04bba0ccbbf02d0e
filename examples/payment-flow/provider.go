package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"sync"
)

// Provider is a fake payment provider over HTTP, as Stripe's API is: POST
// /charges with an Idempotency-Key header charges once per key, and a
// repeat of a key answers with the charge it made the first time. A
// request without a key is refused (400). It counts the charges it made per
// order, and every request it answered.
type Provider struct {
	// OnCharge, when set, is called with a new charge after the provider
	// made it and before it answers: the moment a worker that dies loses
	// the answer (the kill test kills one there).
	OnCharge func(Charge)

	mu       sync.Mutex
	byKey    map[string]Charge
	perOrder map[string]int
	requests int
}

// Charge is one charge the provider made.
type Charge struct {
	ID     string `json:"id"`
	Order  string `json:"order"`
	Amount int    `json:"amount"`
}

// NewProvider returns a provider that has charged nothing.
func NewProvider() *Provider {
	return &Provider{byKey: map[string]Charge{}, perOrder: map[string]int{}}
}

// ServeHTTP implements POST /charges.
func (p *Provider) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/charges" {
		http.Error(w, "POST /charges only", http.StatusNotFound)
		return
	}
	key := r.Header.Get("Idempotency-Key")
	if key == "" {
		http.Error(w, "an Idempotency-Key header is required", http.StatusBadRequest)
		return
	}
	var req struct {
		Order  string `json:"order"`
		Amount int    `json:"amount"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.Order == "" || req.Amount <= 0 {
		http.Error(w, "want a JSON body {order, amount > 0}", http.StatusBadRequest)
		return
	}
	p.mu.Lock()
	p.requests++
	c, seen := p.byKey[key]
	if !seen {
		c = Charge{ID: "ch_" + strconv.Itoa(len(p.byKey)+1), Order: req.Order, Amount: req.Amount}
		p.byKey[key] = c
		p.perOrder[req.Order]++
	}
	p.mu.Unlock()
	if !seen && p.OnCharge != nil {
		p.OnCharge(c)
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(c) //nolint:errcheck // the client retries a lost answer
}

// Charges is how many charges the provider made for each order.
func (p *Provider) Charges() map[string]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]int, len(p.perOrder))
	for k, v := range p.perOrder {
		out[k] = v
	}
	return out
}

// Requests is how many charge requests the provider answered (repeats of a
// key included).
func (p *Provider) Requests() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.requests
}

// charge asks the provider at baseURL to charge amount for order, under
// idempotency key key.
func charge(ctx context.Context, baseURL, key, order string, amount int) (Charge, error) {
	body, _ := json.Marshal(map[string]any{"order": order, "amount": amount})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, baseURL+"/charges", bytes.NewReader(body))
	if err != nil {
		return Charge{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return Charge{}, fmt.Errorf("charge %s: %w", order, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return Charge{}, fmt.Errorf("charge %s: provider answered %s", order, resp.Status)
	}
	var c Charge
	if err := json.NewDecoder(resp.Body).Decode(&c); err != nil {
		return Charge{}, fmt.Errorf("charge %s: decode the provider's answer: %w", order, err)
	}
	return c, nil
}
