package config

import (
	"fmt"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/stretchr/testify/require"
)

func TestError(t *testing.T) {
	err := fmt.Errorf("parsing: %w", Invalid("ipMasq", "%q is not a boolean", "yes"))
	require.EqualError(t, err, `parsing: invalid ipMasq: "yes" is not a boolean`)
	ce, ok := AsCNI(err)
	require.True(t, ok)
	require.Equal(t, uint(types.ErrInvalidNetworkConfig), ce.Code)
	require.Equal(t, `invalid ipMasq: "yes" is not a boolean`, ce.Msg)
	_, ok = AsCNI(fmt.Errorf("other"))
	require.False(t, ok)
}
