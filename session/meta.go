package session

// Meta is what a node keeps about a session besides its events: identity,
// ownership, membership and harness. The owner persists it in the session's
// history file and mirrors the public part to the catalog.
type Meta struct {
	ID        ID      `json:"id"`
	Title     string  `json:"title"`
	Owner     string  `json:"owner"`
	Tenant    string  `json:"tenant,omitempty"`
	Epoch     string  `json:"epoch"`
	CreatedAt Time    `json:"created_at"`
	Members   Members `json:"members"`
	Harness   Harness `json:"harness"`
}

// Stored is an event as a history file stores it: its seq and kind, and the
// event's full JSON encoding, which is what clients receive byte for byte.
type Stored struct {
	Seq  Seq
	Kind Kind
	JSON []byte
}
