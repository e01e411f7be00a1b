package maps

// PktReasonInfo describes one value of enum pkt_reason; PktReasons
// (reasons_gen.go) is generated from bpf/include/types.h.
type PktReasonInfo struct {
	Reason CniPktReason
	Key    string // the C name, lower case, without REASON_: for JSON and scripts
	Text   string // what `ebpf-cni counters` shows: the quoted text of its C comment
	Drop   bool   // named REASON_DROP_*: programs return it through DROP()
}
