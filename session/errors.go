package session

import (
	"errors"
	"fmt"
	"net/http"
)

// Code is a machine-readable error code of the wire contract (DESIGN §7).
type Code string

// The error codes of the wire contract.
const (
	CodeBadRequest      Code = "bad_request"
	CodeUnauthenticated Code = "unauthenticated"
	CodeForbidden       Code = "forbidden"
	CodeNotFound        Code = "not_found"
	CodeConflict        Code = "conflict"
	CodeTooManyRequests Code = "too_many_requests"
	CodePayloadTooLarge Code = "payload_too_large"
	CodeUnavailable     Code = "unavailable"
	CodeInternal        Code = "internal"
)

// Error is an error with a wire code. It travels unchanged from the actor
// through NATS and the gateway to the client, and it is the body of the
// "error" member of REST error responses and of WebSocket error frames.
type Error struct {
	Code    Code   `json:"code"`
	Message string `json:"message"`
	// RetryAfterS, on an unavailable error, says the condition is known
	// to last at least this many seconds (a full disk, say): retrying
	// sooner is pointless. A gateway answers such a refusal from a node at
	// once instead of retrying it, with the HTTP header Retry-After. Zero:
	// no such knowledge (a transient condition, or none said).
	RetryAfterS int64 `json:"retry_after_s,omitempty"`
}

func (e *Error) Error() string { return string(e.Code) + ": " + e.Message }

// Is makes errors.Is(err, ErrNotFound) true for any *Error with the same code.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Code == e.Code && (t.Message == "" || t.Message == e.Message)
}

// Errorf returns an *Error with the given code and a formatted message.
func Errorf(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// Sentinel errors, matched with errors.Is. Any *Error with the same code
// matches, whatever its message.
var (
	ErrBadRequest      = &Error{Code: CodeBadRequest}      // session: bad request
	ErrUnauthenticated = &Error{Code: CodeUnauthenticated} // session: unauthenticated
	ErrForbidden       = &Error{Code: CodeForbidden}       // session: forbidden
	ErrNotFound        = &Error{Code: CodeNotFound}        // session: not found
	ErrConflict        = &Error{Code: CodeConflict}        // session: conflict
	ErrTooManyRequests = &Error{Code: CodeTooManyRequests} // session: too many requests
	ErrPayloadTooLarge = &Error{Code: CodePayloadTooLarge} // session: payload too large
	ErrUnavailable     = &Error{Code: CodeUnavailable}     // session: unavailable
	ErrInternal        = &Error{Code: CodeInternal}        // session: internal
)

// AsError converts any error into an *Error. An error that is not an *Error
// (and does not wrap one) becomes CodeInternal with a generic message, so
// internal details never reach clients.
func AsError(err error) *Error {
	if err == nil {
		return nil
	}
	var e *Error
	if errors.As(err, &e) {
		if e.Message == "" {
			return &Error{Code: e.Code, Message: string(e.Code)}
		}
		return e
	}
	return &Error{Code: CodeInternal, Message: "internal error"}
}

// HTTPStatus returns the HTTP status for a code.
func (c Code) HTTPStatus() int {
	switch c {
	case CodeBadRequest:
		return http.StatusBadRequest
	case CodeUnauthenticated:
		return http.StatusUnauthorized
	case CodeForbidden:
		return http.StatusForbidden
	case CodeNotFound:
		return http.StatusNotFound
	case CodeConflict:
		return http.StatusConflict
	case CodeTooManyRequests:
		return http.StatusTooManyRequests
	case CodePayloadTooLarge:
		return http.StatusRequestEntityTooLarge
	case CodeUnavailable:
		return http.StatusServiceUnavailable
	case CodeInsufficientStorage:
		return http.StatusInsufficientStorage
	default:
		return http.StatusInternalServerError
	}
}
