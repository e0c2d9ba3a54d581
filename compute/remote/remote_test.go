package remote_test

import (
	"testing"

	"github.com/atriumhq/atrium/compute"
	"github.com/atriumhq/atrium/compute/computetest"
	"github.com/atriumhq/atrium/compute/remote"
)

func TestProvider_Contract(t *testing.T) {
	t.Run("NetnsCommandHook", func(t *testing.T) {
		requireBwrap(t)
		computetest.TestProvider(t, func(t *testing.T) compute.Provider {
			return newProvider(t, newNetnsHook(t), remote.Config{})
		})
	})
	t.Run("InProcess", func(t *testing.T) {
		computetest.TestProvider(t, func(t *testing.T) compute.Provider {
			return newProvider(t, newInProcessHook(t, false), remote.Config{})
		})
	})
}
