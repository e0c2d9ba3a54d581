package modelgw

import (
	"encoding/json"
	"net/http"
	"strconv"
)

// writeError answers with status and msg in the error shape of the API
// family the request came to, as the vendor would.
func writeError(w http.ResponseWriter, fam family, status int, msg string) {
	var body any
	switch fam {
	case famAnthropic:
		typ := map[int]string{400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
			404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 529: "overloaded_error"}[status]
		if typ == "" {
			typ = "api_error"
		}
		body = map[string]any{"type": "error", "error": map[string]any{"type": typ, "message": msg}}
	case famGemini:
		st := map[int]string{400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED",
			404: "NOT_FOUND", 413: "INVALID_ARGUMENT", 429: "RESOURCE_EXHAUSTED", 503: "UNAVAILABLE"}[status]
		if st == "" {
			st = "INTERNAL"
		}
		body = map[string]any{"error": map[string]any{"code": status, "message": msg, "status": st}}
	default:
		typ, code := "server_error", any(nil)
		switch status {
		case 400, 404, 413:
			typ = "invalid_request_error"
			if status == 404 {
				code = "model_not_found"
			}
		case 401:
			typ, code = "invalid_request_error", "invalid_api_key"
		case 429:
			typ, code = "requests", "rate_limit_exceeded"
		}
		body = map[string]any{"error": map[string]any{"message": msg, "type": typ, "param": nil, "code": code}}
	}
	b, _ := json.Marshal(body)
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(b)))
	if status == http.StatusTooManyRequests {
		// Short on purpose: an agent told to wait long may wait for hours,
		// and the node ends the turn itself.
		h.Set("Retry-After", "1")
	}
	w.WriteHeader(status)
	w.Write(b)
}
