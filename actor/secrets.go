package actor

import (
	"maps"
	"slices"
	"sort"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/atriumhq/atrium/session"
)

// secretEnv returns the secrets as KEY=VALUE environment entries, in name
// order, decrypted with the node's keyring. The result holds secret values:
// it goes to the sandbox's Exec and nowhere else (never to a log or an
// event). A secret that does not decrypt is left out, with a warning naming
// it (never its value).
func (s *sessionActor) secretEnv(secrets map[string]session.Secret) []string {
	if len(secrets) == 0 {
		return nil
	}
	names := slices.Sorted(maps.Keys(secrets))
	env := make([]string, 0, len(names))
	for _, n := range names {
		v, err := s.h.cfg.SecretKeys.Open(n, secrets[n])
		if err != nil {
			s.log.Warn("secret left out of the harness environment", "secret", n, "err", err)
			continue
		}
		env = append(env, n+"="+v)
	}
	return env
}

// errNoSecretKeys refuses secrets on a node without a keyring.
var errNoSecretKeys = session.Errorf(session.CodeUnavailable,
	"this server has no secrets key, so it cannot store secrets encrypted: its operator sets secrets.key_file or ATRIUM_SECRETS_KEYS (docs/operations.md)")

// sealLegacy seals, in place, the secrets stored in clear before secrets
// were encrypted, so that the metadata written next holds no plaintext.
func sealLegacy(keys *session.SecretKeyring, secrets map[string]session.Secret) {
	if keys == nil {
		return
	}
	for n, sec := range secrets {
		if sec.Sealed == "" && sec.Value != "" {
			sec.Sealed, sec.Value = keys.Seal(n, sec.Value), ""
			secrets[n] = sec
		}
	}
}

// secretLen is the length of a stored secret's value.
func (s *sessionActor) secretLen(name string, sec session.Secret) int {
	if v, err := s.h.cfg.SecretKeys.Open(name, sec); err == nil {
		return len(v)
	}
	return len(sec.Sealed)
}

// changeMeta queues next as the session's metadata and replies to msg once
// it is written. Nothing is logged as an event.
func (s *sessionActor) changeMeta(msg *nats.Msg, next session.Meta, reply func() session.Reply) {
	s.events.metaNext = next
	s.events.metaDirty = true
	s.events.metaAfter = append(s.events.metaAfter, func(err error) {
		if err != nil {
			s.log.Warn("write session metadata", "err", err)
			respond(msg, errorReply(session.Errorf(session.CodeUnavailable, "the change could not be saved: retry")))
			return
		}
		respond(msg, reply())
	})
}

// opSecretSet sets a secret (owner). Its value is never logged.
func (s *sessionActor) opSecretSet(msg *nats.Msg, user string, c *session.Command) {
	if err := session.ValidSecretName(c.Name); err != nil {
		respond(msg, errorReply(err))
		return
	}
	if len(c.Value) > session.MaxSecretBytes {
		respond(msg, errorReply(session.Errorf(session.CodePayloadTooLarge, "a secret's value is at most %d bytes", session.MaxSecretBytes)))
		return
	}
	for i := 0; i < len(c.Value); i++ {
		if c.Value[i] == 0 {
			respond(msg, errorReply(session.Errorf(session.CodeBadRequest, "a secret's value cannot contain NUL bytes (it becomes an environment variable)")))
			return
		}
	}
	keys := s.h.cfg.SecretKeys
	if keys == nil {
		respond(msg, errorReply(errNoSecretKeys))
		return
	}
	next := s.events.metaNext
	total := len(c.Value)
	for n, sec := range next.Secrets {
		if n != c.Name {
			total += s.secretLen(n, sec)
		}
	}
	if _, ok := next.Secrets[c.Name]; !ok && len(next.Secrets) >= session.MaxSecrets {
		respond(msg, errorReply(session.Errorf(session.CodePayloadTooLarge, "a session has at most %d secrets", session.MaxSecrets)))
		return
	}
	if total > session.MaxSecretsBytes {
		respond(msg, errorReply(session.Errorf(session.CodePayloadTooLarge, "a session's secrets hold at most %d bytes together", session.MaxSecretsBytes)))
		return
	}
	secrets := maps.Clone(next.Secrets)
	if secrets == nil {
		secrets = map[string]session.Secret{}
	}
	sealLegacy(keys, secrets)
	secrets[c.Name] = session.Secret{Sealed: keys.Seal(c.Name, c.Value), UpdatedAt: session.Time{Time: time.Now().UTC()}, UpdatedBy: user}
	next.Secrets = secrets
	s.changeMeta(msg, next, func() session.Reply { return session.Reply{} })
}

// opSecretDelete removes a secret (owner).
func (s *sessionActor) opSecretDelete(msg *nats.Msg, c *session.Command) {
	if err := session.ValidSecretName(c.Name); err != nil {
		respond(msg, errorReply(err))
		return
	}
	next := s.events.metaNext
	if _, ok := next.Secrets[c.Name]; !ok {
		respond(msg, errorReply(session.Errorf(session.CodeNotFound, "session has no secret %s", c.Name)))
		return
	}
	secrets := maps.Clone(next.Secrets)
	delete(secrets, c.Name)
	sealLegacy(s.h.cfg.SecretKeys, secrets)
	next.Secrets = secrets
	s.changeMeta(msg, next, func() session.Reply { return session.Reply{} })
}

// opSecrets lists the secrets' names and who set them when (owner); never
// their values.
func (s *sessionActor) opSecrets(msg *nats.Msg) {
	list := make([]session.SecretInfo, 0, len(s.events.metaNext.Secrets))
	for n, sec := range s.events.metaNext.Secrets {
		list = append(list, session.SecretInfo{Name: n, UpdatedAt: sec.UpdatedAt, UpdatedBy: sec.UpdatedBy})
	}
	sort.Slice(list, func(i, j int) bool { return list[i].Name < list[j].Name })
	respond(msg, session.Reply{Secrets: list})
}

// opEgress replaces the session's own egress allowlist (owner). The
// sandbox is opened again with it at the next turn.
func (s *sessionActor) opEgress(msg *nats.Msg, who session.Principal, c *session.Command) {
	own, err := s.h.egress.check(c.Egress)
	if err != nil {
		respond(msg, errorReply(err))
		return
	}
	next := s.events.metaNext
	next.Egress = own
	s.changeMeta(msg, next, func() session.Reply {
		sess := s.sessionFor(who)
		return session.Reply{Session: &sess}
	})
}
