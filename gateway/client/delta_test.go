package client_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/atriumhq/atrium/gateway/client"
	"github.com/atriumhq/atrium/session"
)

// batchServer is a gateway stand-in that speaks atrium.v1+batch when the
// client offers it: a hello, then the frames of frames, then it waits.
func batchServer(t *testing.T, frames []string) *client.Client {
	return wsServer(t, func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, &websocket.AcceptOptions{Subprotocols: []string{session.SubprotocolBatch, session.Subprotocol}})
		if err != nil {
			return
		}
		defer c.CloseNow()
		if c.Subprotocol() != session.SubprotocolBatch {
			c.Close(websocket.StatusPolicyViolation, "no batch")
			return
		}
		hello, _ := json.Marshal(session.HelloFrame{Type: session.FrameHello, Session: session.Session{ID: "s_1", Epoch: "e"}, LastSeq: 5})
		_ = c.Write(r.Context(), websocket.MessageText, hello)
		for _, f := range frames {
			_ = c.Write(r.Context(), websocket.MessageText, []byte(f))
		}
		_, _, _ = c.Read(r.Context()) // until the client leaves
	})
}

func ev(seq session.Seq) string {
	return fmt.Sprintf(`{"seq":%d,"epoch":"e","time":"2026-01-02T03:04:05Z","kind":"output","by":"system","data":{"turn":1,"stream":"stdout","text":"%d"}}`, seq, seq)
}

// TestWatch_EventsFramesAndDeltas: events frames are delivered one event at
// a time, deduplicated like event frames; delta frames only when asked for.
func TestWatch_EventsFramesAndDeltas(t *testing.T) {
	delta := `{"type":"delta","turn":1,"message_id":"m1","text":"Hel"}`
	frames := []string{
		`{"type":"events","events":[` + ev(1) + `,` + ev(2) + `,` + ev(3) + `]}`,
		`{"type":"events","events":[` + ev(2) + `,` + ev(3) + `,` + ev(4) + `,` + ev(5) + `]}`, // 2, 3 again
		delta,
		`{"type":"event","event":` + ev(6) + `}`,
	}
	for _, deltas := range []bool{true, false} {
		t.Run(fmt.Sprintf("deltas=%v", deltas), func(t *testing.T) {
			c := batchServer(t, frames)
			opts := fastOpts
			opts.Deltas = deltas
			st, err := c.Watch(testContext(t), "s_1", 0, opts)
			if err != nil {
				t.Fatalf("Watch: %v", err)
			}
			defer st.Close()
			var got []string
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			for len(got) == 0 || got[len(got)-1] != "6" {
				f, err := st.Next(ctx)
				if err != nil {
					t.Fatalf("Next after %v: %v", got, err)
				}
				switch {
				case f.Event != nil:
					if string(f.Raw) != ev(f.Event.Seq) {
						t.Fatalf("raw %s", f.Raw)
					}
					got = append(got, fmt.Sprint(f.Event.Seq))
				case f.Type == session.FrameDelta:
					if f.Delta == nil || f.Delta.Text != "Hel" || f.Delta.MessageID != "m1" || f.Delta.Turn != 1 {
						t.Fatalf("delta frame %+v", f)
					}
					got = append(got, "delta")
				case f.Type == session.FrameHello:
				default:
					t.Fatalf("unexpected frame %+v", f)
				}
			}
			want := "[1 2 3 4 5 6]"
			if deltas {
				want = "[1 2 3 4 5 delta 6]"
			}
			if fmt.Sprint(got) != want {
				t.Fatalf("delivered %v, want %s", got, want)
			}
		})
	}
}

// TestWatch_EventsFrameGap: an events frame that skips a seq makes the
// stream resume from the last event it delivered.
func TestWatch_EventsFrameGap(t *testing.T) {
	c := batchServer(t, []string{`{"type":"events","events":[` + ev(1) + `,` + ev(3) + `]}`})
	st, err := c.Watch(testContext(t), "s_1", 0, fastOpts)
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	defer st.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		f, err := st.Next(ctx)
		if err != nil {
			t.Fatalf("Next: %v", err)
		}
		if f.Event != nil && f.Event.Seq != 1 {
			t.Fatalf("event %d delivered after 1", f.Event.Seq)
		}
		if f.Type == client.FrameReconnecting {
			if f.After != 1 {
				t.Fatalf("reconnecting after %d, want 1", f.After)
			}
			return
		}
	}
}
