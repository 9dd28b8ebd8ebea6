package daemon

import (
	"errors"

	"github.com/kproxy/kproxy/internal/config"
)

// This file connects the daemon's consumer-side interfaces (ports.go) to the
// packages that implement them.

// defaultInputs builds the file or API source and the change tracker.
func defaultInputs(o *config.Options, nodeName string, notify func()) (Inputs, error) {
	return Inputs{}, errors.New("sources are not wired in yet")
}

// defaultDataplanes lists the backends this binary has.
func defaultDataplanes() map[string]DataplaneFunc {
	return map[string]DataplaneFunc{}
}
