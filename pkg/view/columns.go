package view

// Columns are what a feature shows of every endpoint in the CLI's
// endpoints command, beside the core's columns: cells in the table and one
// field of each endpoint's JSON object. The endpoints command asks every
// registered feature for its own (feature.Feature.Columns, nil: none), in
// registration order, and names none of them: the feature keeps its maps
// and their meaning (NetworkPolicy: POLICY, POLICY DROPS, "policy").
type Columns struct {
	// Header names the table's columns, shown after the core's and before
	// STATE.
	Header []string
	// Help says what the columns show, for the command's --help: one
	// clause per column, each ending with a comma ("POLICY: ...,").
	Help string
	// Key is the endpoint's JSON field that holds JSON; JSONHelp names
	// what it holds ("policy (ingress, egress: ...)").
	Key, JSONHelp string
	// Read reads the columns of eps: one Cells each, in their order. It
	// only reads, and shows a map that is not pinned as empty.
	Read func(ctx *Context, eps []EndpointRef) ([]Cells, error)
}

// Cells are one endpoint's columns: Text, one cell per Header; JSON, the
// value of Key.
type Cells struct {
	Text []string
	JSON any
}

// Matches says whether the endpoint is the one a --pod flag names:
// namespace/name, containerID/ifname or its short form (Name). Empty
// matches every endpoint.
func (e *EndpointRef) Matches(want string) bool {
	if want == "" {
		return true
	}
	if e.PodName != "" && e.PodNamespace+"/"+e.PodName == want {
		return true
	}
	return e.ContainerID != "" && (e.ContainerID+"/"+e.IfName == want || Name(e.ContainerID, e.IfName) == want)
}
