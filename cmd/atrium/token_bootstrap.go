package main

import (
	"errors"
	"io/fs"

	"github.com/spf13/cobra"

	"github.com/atriumhq/atrium/cmd/atrium/internal/config"
	"github.com/atriumhq/atrium/cmd/atrium/internal/server"
	"github.com/atriumhq/atrium/gateway/auth"
	"github.com/atriumhq/atrium/gateway/client"
	"github.com/atriumhq/atrium/session"
)

// DefaultBootstrapUser is whom `atrium token create --bootstrap` makes a
// token for without --user.
const DefaultBootstrapUser = "admin"

// bootstrapFlags are token create's --bootstrap and its companions.
type bootstrapFlags struct {
	on           bool
	user, tenant string
	data, config string
}

func (b *bootstrapFlags) register(cmd *cobra.Command) {
	f := cmd.Flags()
	f.BoolVar(&b.on, "bootstrap", false, "create a token with the server's bootstrap key, read from its data directory (on the server's machine)")
	f.StringVar(&b.user, "user", DefaultBootstrapUser, "with --bootstrap: the user the token acts as")
	f.StringVar(&b.tenant, "tenant", "", "with --bootstrap: the user's tenant (default: the default tenant)")
	f.StringVar(&b.data, "data", server.DefaultDataDir, "with --bootstrap: the server's data directory")
	f.StringVarP(&b.config, "config", "c", "", "with --bootstrap: the server's configuration file, to read its data_dir")
}

// set reports whether a companion flag was given.
func (b *bootstrapFlags) set(cmd *cobra.Command) bool {
	for _, n := range []string{"user", "tenant", "data", "config"} {
		if cmd.Flags().Changed(n) {
			return true
		}
	}
	return false
}

// client returns a Client that authenticates with the bootstrap key as the
// user and tenant asked for.
func (b *bootstrapFlags) client(cmd *cobra.Command, env *cliEnv, conn *connFlags) (*client.Client, error) {
	if cmd.Flags().Changed("token") || lookupEnv(env, envToken) != "" {
		return nil, usageError(cmd, "--bootstrap authenticates with the server's key: drop --token / %s", envToken)
	}
	if err := session.ValidUser(b.user); err != nil {
		return nil, usageError(cmd, "--user: %s", session.AsError(err).Message)
	}
	dir := b.data
	if b.config != "" {
		if cmd.Flags().Changed("data") {
			return nil, usageError(cmd, "give --data or --config, not both")
		}
		f, err := config.Load(b.config, env.getenv)
		if err != nil {
			return nil, err
		}
		dir = f.DataDir
	}
	key, err := auth.ReadBootstrapKey(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, cliError{err: err, msg: "no bootstrap key in " + dir,
			hint: "run this on the server's machine with --data (or --config) naming the data directory of a server in auth.mode tokens that has started once"}
	}
	if errors.Is(err, fs.ErrPermission) {
		return nil, cliError{err: err, msg: "cannot read the bootstrap key in " + dir + ": permission denied",
			hint: "run it as the user the server runs as (e.g. sudo -u atrium atrium token create --bootstrap ...)"}
	}
	if err != nil {
		return nil, err
	}
	c, err := conn.anonymous(cmd, env)
	if err != nil {
		return nil, err
	}
	c.Token = auth.BootstrapToken(key, b.user, b.tenant)
	conn.source = "bootstrap"
	return c, nil
}
