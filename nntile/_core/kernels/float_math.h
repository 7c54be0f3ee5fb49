/* The math functions of a dtype that computes in float (fp32, and bf16, which loads into
 * float): included by instantiate.h inside each such dtype's block. Without include guard:
 * instantiate_one.h undefines them after every dtype. */
#define EXP expf
#define VEXP nntile_vexpf
#define LOG logf
#define ERF erff
#define TANH tanhf
#define SQRT sqrtf
#define COS cosf
#define SIN sinf
