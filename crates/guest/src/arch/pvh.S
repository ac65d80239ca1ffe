/* PVH entry (docs/ABI.md, "PVH entry"): another VMM enters the image here in
 * 32-bit protected mode, paging off, CPL0, EBX = the hvm_start_info page.
 * Build what Hover's 64-bit entry state gives: identity paging of the first
 * 4 GiB (2 MiB pages, U bit set), a GDT with Hover's selectors and a TSS,
 * long mode, a boot stack; then enter `_start` with RDI = the start-info
 * page and RSI = 0 (the boot vCPU). Emulated here (CPL0): kept short. */
    .section .note.Xen, "a", @note
    .balign 4
    .long 4                          /* namesz */
    .long 8                          /* descsz */
    .long {phys32_entry_note}        /* type */
    .asciz "Xen"
    .balign 4
    .quad pvh_start32
    .balign 4

    .section .text.boot, "ax"
    .code32
    .global pvh_start32
pvh_start32:
    cld
    mov %ebx, %esi                   /* keep the start-info page */
    mov %ebx, {pvh_start_info}       /* ... for the other vCPUs too */
    /* Mask the legacy PICs: firmware (SeaBIOS under QEMU's pc machine)
     * leaves the PIT ticking through them, and the runtime enables
     * interrupts before its IDT is filled. */
    mov $0xff, %al
    out %al, $0xa1
    out %al, $0x21
    /* The TSC rate, from the hypervisor leaf 0x4000_0010 when offered
     * (CPUID at CPL0 is the VMM's table here). */
    mov $0x40000000, %eax
    cpuid
    cmp $0x40000010, %eax
    jb 1f
    mov $0x40000010, %eax
    cpuid
    mov %eax, {pvh_tsc_khz}
1:
    /* Page directories: 2048 x 2 MiB, present | writable | user | large. */
    mov ${pvh_pd}, %edi
    xor %ecx, %ecx
2:  mov %ecx, %eax
    shl $21, %eax
    or $0x87, %eax
    mov %eax, (%edi,%ecx,8)
    movl $0, 4(%edi,%ecx,8)
    inc %ecx
    cmp $2048, %ecx
    jne 2b
    /* PDPT entries 0-3 -> the four directories; PML4 entry 0 -> the PDPT. */
    mov ${pvh_pdpt}, %edi
    mov ${pvh_pd}, %eax
    or $7, %eax
    mov %eax, (%edi)
    add $0x1000, %eax
    mov %eax, 8(%edi)
    add $0x1000, %eax
    mov %eax, 16(%edi)
    add $0x1000, %eax
    mov %eax, 24(%edi)
    mov ${pvh_pml4}, %edi
    mov ${pvh_pdpt}, %eax
    or $7, %eax
    mov %eax, (%edi)
    /* TSS descriptors (limit 0x67, available): GDT entries 5-6 for
     * pvh_tss, 8-9 for the other vCPUs' pvh_ap_tss. */
    .macro hover_pvh_tss_desc tss, desc
    mov $\tss, %eax
    mov %eax, %edx
    shl $16, %eax
    or $0x67, %eax
    mov %eax, \desc
    mov %edx, %eax
    shr $16, %eax
    and $0xff, %eax
    or $0x8900, %eax
    mov %edx, %ecx
    and $0xff000000, %ecx
    or %ecx, %eax
    mov %eax, \desc + 4
    .endm
    hover_pvh_tss_desc {pvh_tss}, pvh_gdt + 0x28
    hover_pvh_tss_desc {pvh_ap_tss}, pvh_gdt + 0x40
    /* RSP0 of each: the top of its boot stack. An interrupt or nub call
     * from CPL3 switches to it until the runtime loads the CPU's own TSS. */
    mov ${pvh_stack}+16384, %eax
    mov %eax, {pvh_tss}+4
    mov ${pvh_ap_stack}+4096, %eax
    mov %eax, {pvh_ap_tss}+4
    lgdt pvh_gdtr
    /* Long mode: PAE, CR3, EFER.LME, then paging (with SSE and FSGSBASE
     * enabled as Hover's entry state has them), on the stub's tables; then
     * the data segments. Every vCPU goes through it. */
    .macro hover_pvh_long_mode next
    mov ${entry_cr4}, %eax
    mov %eax, %cr4
    mov ${pvh_pml4}, %eax
    mov %eax, %cr3
    mov $0xc0000080, %ecx
    rdmsr
    or ${entry_efer}, %eax           /* LME | SCE: LMA is the CPU's to set */
    wrmsr
    mov ${entry_cr0}, %eax
    mov %eax, %cr0
    ljmp ${kernel_cs}, $\next
    .code64
\next:
    mov ${kernel_ds}, %eax
    mov %eax, %ds
    mov %eax, %es
    mov %eax, %ss
    mov %eax, %fs
    mov %eax, %gs
    .endm
    hover_pvh_long_mode pvh_start64
    mov ${tss_sel}, %eax
    ltr %ax
    mov ${pvh_stack}+16384, %rsp
    mov %esi, %edi                   /* rdi = start-info page */
    xor %esi, %esi                   /* rsi = vCPU 0 */
    jmp _start

/* The other vCPUs (started by vCPU 0 with INIT/SIPI, pvh.rs): the SIPI
 * starts them in real mode at the page the trampoline was copied to. They
 * reuse vCPU 0's page tables and GDT, one at a time on one small stack
 * and one TSS (vCPU 0 waits for each until the runtime has loaded that
 * CPU's own tables). The TSS matters: the runtime's first nub call from
 * CPL3 takes RSP0 from it; without `ltr` the CPU would read RSP0 from the
 * reset TR (base 0: the real-mode vector table), which under SeaBIOS is
 * not canonical and resets the VM. */
    .code16
    .global pvh_ap_tramp, pvh_ap_tramp_end
pvh_ap_tramp:
    cli
    cld
    mov %cs, %ax
    mov %ax, %ds
    lgdtl pvh_ap_gdtr - pvh_ap_tramp
    mov %cr0, %eax
    or $1, %al
    mov %eax, %cr0
    ljmpl $0x38, $pvh_ap_start32
    .balign 4
pvh_ap_gdtr:
    .word pvh_gdt_end - pvh_gdt - 1
    .long pvh_gdt
pvh_ap_tramp_end:

    .code32
pvh_ap_start32:
    mov ${kernel_ds}, %eax
    mov %eax, %ds
    mov %eax, %es
    mov %eax, %ss
    hover_pvh_long_mode pvh_ap_start64
    andb $0xfd, pvh_gdt + 0x45       /* available again after the last AP */
    mov $0x40, %eax
    ltr %ax
    mov ${pvh_ap_stack}+4096, %rsp
    mov {pvh_ap_index}(%rip), %esi   /* rsi = this vCPU's index */
    mov {pvh_start_info}(%rip), %edi /* rdi = the start-info page */
    jmp _start

    .section .data
    .balign 16
pvh_gdt:
    .quad 0
    .quad 0x00AF9A000000FFFF         /* 0x08: 64-bit code, DPL0 */
    .quad 0x00CF92000000FFFF         /* 0x10: data, DPL0 */
    .quad 0x00CFF2000000FFFF         /* 0x18: data, DPL3 */
    .quad 0x00AFFA000000FFFF         /* 0x20: 64-bit code, DPL3 */
    .quad 0                          /* 0x28: TSS, filled in */
    .quad 0
    .quad 0x00CF9A000000FFFF         /* 0x38: 32-bit code, for the APs */
    .quad 0                          /* 0x40: the APs' TSS, filled in */
    .quad 0
pvh_gdt_end:
pvh_gdtr:
    .word pvh_gdt_end - pvh_gdt - 1
    .quad pvh_gdt
    .text
