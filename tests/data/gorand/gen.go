// gen prints, as JSON on standard output, draws from Go's math/rand (v1) for the seeds, methods
// and bounds that tests/test_gorand.py checks blisjax.gorand against. Run it with a Go toolchain
// (`go run gen.go > expected.json`); its output is the checked-in expected.json.
package main

import (
	"encoding/json"
	"hash/fnv"
	"math/rand"
	"os"
	"runtime"
)

// Counts are chosen so every seed draws more Int63 values than the 607-word ring holds, which
// makes every word of the seeded state (and so every rngCooked entry) reach an output.
const (
	int63Draws   = 650
	uint64Draws  = 50
	int31Draws   = 200
	uint32Draws  = 50
	float64Draws = 100
	boundedDraws = 40
	mixedRounds  = 25
)

type boundedDraw struct {
	N     int64   `json:"n"`
	Draws []int64 `json:"draws"`
}

type seedDraws struct {
	Seed    int64         `json:"seed"`
	Int63   []int64       `json:"int63"`
	Uint64  []uint64      `json:"uint64"`
	Int31   []int32       `json:"int31"`
	Uint32  []uint32      `json:"uint32"`
	Float64 []float64     `json:"float64"`
	Int31n  []boundedDraw `json:"int31n"`
	Intn    []boundedDraw `json:"intn"`
	Int63n  []boundedDraw `json:"int63n"`
	Mixed   []any         `json:"mixed"`
}

type mixedOp struct {
	Op string `json:"op"`
	N  int64  `json:"n"`
}

type subsystemDraws struct {
	MasterSeed  int64   `json:"master_seed"`
	Name        string  `json:"name"`
	DerivedSeed int64   `json:"derived_seed"`
	IntnBounds  []int64 `json:"intn_bounds"`
	Intn        []int64 `json:"intn"`
	Int63       []int64 `json:"int63"`
}

type output struct {
	GoVersion  string           `json:"go_version"`
	MixedOps   []mixedOp        `json:"mixed_ops"`
	Seeds      []seedDraws      `json:"seeds"`
	Subsystems []subsystemDraws `json:"subsystems"`
}

var seeds = []int64{
	0, 1, 42, -1,
	1 << 62,
	-7305553186016513297,
	-9223372036854775808, // math.MinInt64
	2147483647,           // 2^31-1: reduces to 0, which seeding replaces by 89482311
	89482311,
}

var int31nBounds = []int64{
	1, 2, 3, 7, 10, 16, 1024, 1 << 30, 1000000000, 1<<30 + 1, 1717986918,
	1<<31 - 3, 1<<31 - 2, 1<<31 - 1,
}

var intnBounds = []int64{
	1, 2, 3, 5, 7, 8, 64, 100, 128000, 1000000000, 1<<31 - 2, 1<<31 - 1, 1 << 31,
	1<<31 + 1, 1 << 32, 3000000000, 1000000000000, 1 << 62, 1<<62 + 1, 1<<63 - 1,
}

var int63nBounds = []int64{
	1, 2, 3, 1000000000, 1 << 40, 1000000000000000000, 1<<62 + 1, 3 << 61, 1<<63 - 1,
}

var mixedOps = []mixedOp{
	{"int63", 0}, {"int31n", 7}, {"intn", 1<<31 + 5}, {"float64", 0},
	{"int63n", 1000000000000000007}, {"int31", 0}, {"uint64", 0}, {"intn", 3},
	{"int31n", 1<<30 + 1}, {"uint32", 0},
}

var subsystemNames = []string{
	"workload", "workload-gen", "router", "prefill-router", "decode-router", "autoscaler",
	"node-provisioning", "instance-loading", "kv-offload",
}

var subsystemMasterSeeds = []int64{42, 0, 1, -1, 123456789, 1<<63 - 1}

func fnv1a64(s string) int64 {
	h := fnv.New64a()
	h.Write([]byte(s))
	return int64(h.Sum64())
}

func drawSeed(seed int64) seedDraws {
	d := seedDraws{Seed: seed}
	r := rand.New(rand.NewSource(seed))
	for i := 0; i < int63Draws; i++ {
		d.Int63 = append(d.Int63, r.Int63())
	}
	r = rand.New(rand.NewSource(seed))
	for i := 0; i < uint64Draws; i++ {
		d.Uint64 = append(d.Uint64, r.Uint64())
	}
	r = rand.New(rand.NewSource(seed))
	for i := 0; i < int31Draws; i++ {
		d.Int31 = append(d.Int31, r.Int31())
	}
	r = rand.New(rand.NewSource(seed))
	for i := 0; i < uint32Draws; i++ {
		d.Uint32 = append(d.Uint32, r.Uint32())
	}
	r = rand.New(rand.NewSource(seed))
	for i := 0; i < float64Draws; i++ {
		d.Float64 = append(d.Float64, r.Float64())
	}
	for _, n := range int31nBounds {
		r = rand.New(rand.NewSource(seed))
		b := boundedDraw{N: n}
		for i := 0; i < boundedDraws; i++ {
			b.Draws = append(b.Draws, int64(r.Int31n(int32(n))))
		}
		d.Int31n = append(d.Int31n, b)
	}
	for _, n := range intnBounds {
		r = rand.New(rand.NewSource(seed))
		b := boundedDraw{N: n}
		for i := 0; i < boundedDraws; i++ {
			b.Draws = append(b.Draws, int64(r.Intn(int(n))))
		}
		d.Intn = append(d.Intn, b)
	}
	for _, n := range int63nBounds {
		r = rand.New(rand.NewSource(seed))
		b := boundedDraw{N: n}
		for i := 0; i < boundedDraws; i++ {
			b.Draws = append(b.Draws, r.Int63n(n))
		}
		d.Int63n = append(d.Int63n, b)
	}
	r = rand.New(rand.NewSource(seed))
	for round := 0; round < mixedRounds; round++ {
		for _, op := range mixedOps {
			var v any
			switch op.Op {
			case "int63":
				v = r.Int63()
			case "int31":
				v = r.Int31()
			case "uint32":
				v = r.Uint32()
			case "uint64":
				v = r.Uint64()
			case "float64":
				v = r.Float64()
			case "int31n":
				v = r.Int31n(int32(op.N))
			case "intn":
				v = r.Intn(int(op.N))
			case "int63n":
				v = r.Int63n(op.N)
			default:
				panic("unknown op " + op.Op)
			}
			d.Mixed = append(d.Mixed, v)
		}
	}
	return d
}

// drawSubsystem follows BLIS's PartitionedRNG.ForSubsystem: the "workload" stream is seeded with
// the master seed itself, every other stream with master XOR int64(FNV-1a-64(name)).
func drawSubsystem(master int64, name string) subsystemDraws {
	derived := master ^ fnv1a64(name)
	if name == "workload" {
		derived = master
	}
	d := subsystemDraws{MasterSeed: master, Name: name, DerivedSeed: derived}
	r := rand.New(rand.NewSource(derived))
	for i := 0; i < 30; i++ {
		n := int64(2 + i%7) // tie counts 2..8, as a router's Intn(len(tied)) would draw
		d.IntnBounds = append(d.IntnBounds, n)
		d.Intn = append(d.Intn, int64(r.Intn(int(n))))
	}
	for i := 0; i < 5; i++ {
		d.Int63 = append(d.Int63, r.Int63())
	}
	return d
}

func main() {
	out := output{GoVersion: runtime.Version(), MixedOps: mixedOps}
	for _, s := range seeds {
		out.Seeds = append(out.Seeds, drawSeed(s))
	}
	for _, m := range subsystemMasterSeeds {
		for _, name := range subsystemNames {
			out.Subsystems = append(out.Subsystems, drawSubsystem(m, name))
		}
	}
	enc := json.NewEncoder(os.Stdout)
	if err := enc.Encode(out); err != nil {
		panic(err)
	}
}
